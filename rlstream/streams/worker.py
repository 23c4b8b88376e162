"""Run stream processors as one faust worker process:

    python -m rlstream.streams.worker score_rollouts assemble_experience --app-id ID

The app id is the consumer group: workers started with the same id share the partitions.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import faust

from rlstream import metrics, sandbox
from rlstream.config import Config
from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.streams.app import Glue, Worker, make_app
from rlstream.streams.processors import PROCESSORS, ProcessorConfig
from rlstream.trainers.experience import RowLimits
from rlstream.trainers.rewards import make_reward_fn


def run_limits(path: Path | None) -> RowLimits:
    """What the run's rows can hold, from its config (its tokenizer's vocabulary, its context and
    group size); without one only what any row must satisfy is checked."""
    if path is None:
        return RowLimits()
    from rlstream.config import Config
    from rlstream.trainers.tokens import vocab_size

    cfg = Config.read(path)
    sandbox.configure(cfg.sandbox)  # the code verifier's executions get the run's limits
    size = vocab_size(cfg.model)
    if size is None:  # no tokenizer.json to read: the tokenizer itself says (torch comes along)
        from rlstream.trainers.lm import load_tokenizer

        size = load_tokenizer(cfg.model).vocab_size
    return RowLimits(size, cfg.model.block_size, cfg.rl.group_size)


def build(app_id: str, names: list[str], cfg: ProcessorConfig, endpoints: Endpoints) -> faust.App:
    unknown = [n for n in names if n not in PROCESSORS]
    if unknown:
        raise SystemExit(f"unknown processor(s) {unknown}; known: {sorted(PROCESSORS)}")
    app = make_app(app_id, endpoints)
    glue = Glue(app, consumer_name=app_id, run_id=cfg.run_id)
    for name in names:
        PROCESSORS[name](app, glue, cfg)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("processors", nargs="+", help=f"any of {sorted(PROCESSORS)}")
    parser.add_argument("--app-id", help="faust app id = consumer group [default: the --config "
                        "run's processors group]")  # fmt: skip
    parser.add_argument("--source", help="read this topic instead of the processor's input")
    parser.add_argument("--sink", help="write this topic instead of the processor's output")
    parser.add_argument("--verifier", default="verifier", help="verifier name on rewards")
    parser.add_argument("--no-archive", action="store_true", help="do not archive experience")
    parser.add_argument("--reward-rules", help="JSON reward-rules file score_rollouts applies")
    parser.add_argument("--reward-fn", help="module:function reward function (TRL's shape)")
    parser.add_argument("--verifier-timeout-s", type=float, help="[default: the --config run's, "
                        "else 10]")  # fmt: skip
    parser.add_argument("--run-id", help="process only this run's rows [default: the --config "
                        "run's; without a config, every run's]")  # fmt: skip
    parser.add_argument("--config", type=Path, help="the run's config: rows are checked against "
                        "its model's vocabulary and context and its group size; it gives the "
                        "app id, run id and reward settings not given")  # fmt: skip
    parser.add_argument("--loglevel", default=os.environ.get("RLSTREAM_LOGLEVEL", "WARNING"))
    args = parser.parse_args(argv)
    if args.config is not None:  # a pod of the cluster manifests gives only its run's config
        run = Config.read(args.config)
        args.app_id = args.app_id or run.group("processors")
        args.run_id = args.run_id or run.run_id
        if not (args.reward_rules or args.reward_fn):
            args.reward_rules, args.reward_fn = run.rl.reward_rules, run.rl.reward_fn
        if args.verifier_timeout_s is None:
            args.verifier_timeout_s = run.rl.verifier_timeout_s
    args.verifier_timeout_s = 10.0 if args.verifier_timeout_s is None else args.verifier_timeout_s
    if not args.app_id:
        parser.error("--app-id: needed without --config")
    endpoints = Endpoints.from_env()
    store = None if args.no_archive else ObjectStore(endpoints)
    custom = args.reward_rules or args.reward_fn
    reward_fn = make_reward_fn(args.reward_rules, args.reward_fn) if custom else None
    cfg = ProcessorConfig(
        args.source, args.sink, args.verifier, reward_fn, args.verifier_timeout_s, store=store,
        run_id=args.run_id, limits=run_limits(args.config),
    )  # fmt: skip
    app = build(args.app_id, args.processors, cfg, endpoints)
    logging.basicConfig(level=args.loglevel)
    metrics.serve_from_env()
    worker = Worker(app, loglevel=args.loglevel, quiet=True)
    sys.argv = sys.argv[:1]  # faust's Worker parses argv too
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
