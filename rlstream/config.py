"""Every setting of a run, nested by concern, each default defined once.

    cfg = Config()                                         # the defaults
    cfg = load_config("run.yaml", ["rl.lr=3e-5"])          # a YAML/JSON file, then --set
    print(show(cfg))                                       # the effective config as YAML

The in-process loop (`rlstream train`), the streaming loop (`rlstream run`) and the benchmarks
all read the same `Config`, so "the same settings" is true by construction. A section is a
small dataclass whose every field has a one-line docstring (`rlstream config show --help`);
`__post_init__` rejects bad values with a `ConfigError` naming the field and what it accepts.
"""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting that is unknown or has a bad value; the message names the field and the fix."""


def _choice(section: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{section}.{name}: {value!r} is not one of {', '.join(map(str, allowed))}"
        )


def _at_least(section: str, name: str, value, low) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{section}.{name}: {value!r} must be >= {low}")


@dataclass
class ModelConfig:
    path: str = "preset:tiny"
    """a local Hugging Face model directory, or preset:NAME (from scratch: tiny, qwen2-0.5b)"""
    n_layer: int = 4
    """transformer layers (the tiny preset)"""
    n_head: int = 4
    """attention heads (the tiny preset)"""
    n_embd: int = 128
    """embedding width (the tiny preset)"""
    block_size: int = 32
    """context length (prompt + completion)"""
    tokenizer: str = "char"
    """a preset's tokenizer: char (one token per printable ASCII character), bpe:N (a byte-level
    BPE of N tokens trained on the run's corpus and train prompts, saved with the model; the run
    names its directory here), or a tokenizer directory. A model directory brings its own"""
    chat_template: str = "auto"
    """auto: prompts go through the tokenizer's chat template when it has one; off: raw text"""
    lora: str | None = None
    """LoRA adapters on a model directory (peft), e.g. r=16,alpha=32[,dropout=0.05]; none: full
    fine-tuning. Policy versions and exports are merged weights"""
    device: str = "auto"
    """cpu, cuda or auto (cuda when available)"""
    backend: str = "auto"
    """optimisation backend: torch, deepspeed, or auto (deepspeed on CUDA when installed)"""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage"""
    threads: int | None = None
    """torch CPU threads per process (default: 2 in-process, 1 per streaming process)"""

    def __post_init__(self):
        from rlstream.trainers.modelpath import (
            ModelPathError,
            parse_lora,
            parse_tokenizer,
            resolve_path,
        )

        try:
            kind, _ = resolve_path(self.path)
            parse_tokenizer(self.tokenizer, kind)
            if self.lora is not None:
                parse_lora(self.lora)
                if kind == "preset":
                    raise ModelPathError(
                        "model.lora: LoRA adapts a trained checkpoint; a preset starts from "
                        "random weights (give --model DIR)"
                    )
        except ModelPathError as exc:
            raise ConfigError(str(exc)) from None
        _choice("model", "chat_template", self.chat_template, ("auto", "off"))
        _choice("model", "device", self.device, ("auto", "cpu", "cuda"))
        _choice("model", "backend", self.backend, ("auto", "torch", "deepspeed"))
        _choice("model", "zero_stage", self.zero_stage, (0, 1, 2, 3))
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            _at_least("model", name, getattr(self, name), 1)
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd ({self.n_embd}) must be a multiple of model.n_head")


@dataclass
class DataConfig:
    tasks: str = "add,sub"
    """task mix: name[:weight][@dmin-dmax], comma separated (add sub mul chain countdown word
    rg:<reasoning-gym dataset>)"""
    pool_size: int = 20_000
    """train prompts in the selection pool"""
    corpus_docs: int = 100_000
    """pre-training documents (worked solutions from the train split)"""
    flaw_rate: float = 0.65
    """share of flawable documents written with their family's systematic mistake"""
    format: str = "direct"
    """how the generated prompts are answered: direct (the answer alone) or cot (a worked
    solution, then the final answer in <answer>...</answer>, which alone is verified; unless
    given, model.block_size is then 96 and rl.max_new_tokens 64: FORMAT_DEFAULTS)"""
    prompts: str | None = None
    """the run's prompts: a JSONL/CSV/Parquet file (published to rl.prompts.v1 first) or
    topic:DATASET (already there, from any producer); unset: generated from data.tasks"""
    corpus: str | None = None
    """pre-training documents: a file or topic:DATASET like data.prompts; unset: the generated
    corpus, or (with data.prompts) the train prompts written out with their answers"""
    dataset: str | None = None
    """the dataset name the run's prompts and documents carry; unset: from data.prompts (a
    file's stem, topic:NAME's NAME), or generated-<run_id>"""
    heldout_frac: float = 0.2
    """share of a user dataset's prompts held out for evaluation when its rows carry no split
    (chosen by prompt_id, so the same prompts in every run)"""

    def __post_init__(self):
        from rlstream.trainers.envs import TaskMix, get_task

        _at_least("data", "pool_size", self.pool_size, 1)
        _at_least("data", "corpus_docs", self.corpus_docs, 1)
        if not 0 <= self.flaw_rate <= 1:
            raise ConfigError(f"data.flaw_rate: {self.flaw_rate!r} must be in [0, 1]")
        if not 0 < self.heldout_frac < 1:
            raise ConfigError(f"data.heldout_frac: {self.heldout_frac!r} must be in (0, 1)")
        try:
            TaskMix.parse(self.tasks)
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"data.tasks: {exc.args[0]}") from None
        _choice("data", "format", self.format, ("direct", "cot"))
        if self.format == "cot":
            mix = TaskMix.parse(self.tasks)
            flat = [n for n in mix.weights if not hasattr(get_task(n), "solve")]
            if flat:
                raise ConfigError(f"data.format: cot: task {flat[0]!r} has no worked solutions "
                                  "(the built-in families do); use data.format=direct")  # fmt: skip
        for name in ("prompts", "corpus"):
            source = getattr(self, name)
            if source is None or source.startswith("topic:"):
                if source == "topic:":
                    raise ConfigError(f"data.{name}: give the dataset, topic:NAME")
                continue
            if not Path(source).is_file():
                raise ConfigError(
                    f"data.{name}: no such file {source!r}; give a JSONL, CSV or Parquet file "
                    "or topic:DATASET"
                )
            if Path(source).suffix.lower() not in (".jsonl", ".ndjson", ".json", ".csv",
                                                    ".parquet", ".pq"):  # fmt: skip
                raise ConfigError(f"data.{name}: {source!r} is not .jsonl, .csv or .parquet")


@dataclass
class PretrainConfig:
    batch: int = 128
    """documents per pre-training step"""
    lr: float = 2e-3
    """peak learning rate (AdamW 0.9/0.95, wd 0.1; cosine to a tenth over max_steps)"""
    max_steps: int = 2000
    """cap on pre-training steps (the cosine schedule's length); the plateau may stop earlier"""
    warmup_steps: int = 100
    """linear warmup steps"""
    val_interval: int = 200
    """steps between validation-loss checks"""
    patience: int = 2
    """validation checks without improvement before pre-training is declared converged"""
    min_delta: float = 0.01
    """smallest validation-loss improvement that counts"""

    def __post_init__(self):
        for name in ("batch", "max_steps", "val_interval", "patience"):
            _at_least("pretrain", name, getattr(self, name), 1)


@dataclass
class RLConfig:
    algo: str = "grpo"
    """advantage estimator: grpo (group-normalised, no critic) or ppo (value head + GAE)"""
    steps: int = 200
    """RL updates"""
    prompts_per_step: int = 32
    """prompt groups per update (B)"""
    group_size: int = 8
    """completions per prompt (G)"""
    temperature: float = 1.0
    """rollout and pass@1 temperature (old logprobs are tempered: keep 1.0)"""
    max_new_tokens: int = 8
    """longest completion"""
    lr: float | None = None
    """RL learning rate, cosine-decayed to lr x min_lr_ratio over `steps`; unset, it follows
    algo (see `learning_rate`)"""
    min_lr_ratio: float = 0.1
    """final learning rate as a share of lr"""
    kl_coef: float = 0.0
    """weight of the KL(pi || ref) penalty (k3) to the frozen pre-trained reference"""
    clip: float = 0.2
    """PPO ratio clip (also bounds the importance weights of stale experience)"""
    vf_coef: float = 0.5
    """value-loss weight (ppo)"""
    ent_coef: float = 0.01
    """entropy-bonus weight (ppo; grpo uses none)"""
    gamma: float = 0.99
    """GAE discount (ppo)"""
    lam: float = 0.95
    """GAE lambda (ppo)"""
    update_epochs: int | None = None
    """passes over each batch (default: 1 for grpo, 10 for ppo as in the design notes)"""
    num_minibatches: int | None = None
    """minibatches per epoch (default: 1 for grpo, 4 for ppo)"""
    max_policy_lag: int = 4
    """groups produced more than this many versions before the update are dropped (counted)"""
    max_grad_norm: float = 1.0
    """gradient clipping norm (pre-training and RL)"""
    hybrid: bool = False
    """mix pre-training loss into RL updates; verified rollouts feed the corpus it reads"""
    hybrid_ratio: float = 0.3
    """share of hybrid compute spent on pre-training loss (0.3 = RL:LM 7:3)"""
    lm_coef: float = 1.0
    """weight of the pre-training loss in hybrid updates"""
    reward_rules: str | None = None
    """JSON reward-rules file (default: each prompt's verifier, 1 or 0)"""
    reward_fn: str | None = None
    """your reward function, TRL's shape: module:function or path/file.py:function, called as
    fn(completions, **columns) -> list[float] (answer, text, task, prompt_id, ... one per row)"""
    verifier_timeout_s: float = 10.0
    """longest a verifier or reward function may take on one group; one that raises or runs
    over gives the group reward 0 and a dead letter with the reason"""
    filter_zero_variance: bool = False
    """drop groups whose rewards are all equal instead of training on them (DAPO's dynamic
    sampling; dropped groups count as consumed, the streaming scheduler refills them)"""
    filter_max_rounds: int = 8
    """the filter's cap: after filter_max_rounds x prompts_per_step dropped groups in one
    batch, zero-variance groups fill the rest (a pool with nothing to learn must not stall)"""

    def __post_init__(self):
        _choice("rl", "algo", self.algo, ("grpo", "ppo"))
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens"):
            _at_least("rl", name, getattr(self, name), 1)
        _at_least("rl", "update_epochs", self.update_epochs, 1)
        _at_least("rl", "num_minibatches", self.num_minibatches, 1)
        _at_least("rl", "max_policy_lag", self.max_policy_lag, 0)
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"rl.lr: {self.lr!r} must be > 0 (or unset: it follows rl.algo)")
        if self.algo == "grpo" and self.group_size < 2:
            raise ConfigError("rl.group_size: grpo needs >= 2 (advantages are relative in a group)")
        if not 0 <= self.hybrid_ratio < 1:
            raise ConfigError(f"rl.hybrid_ratio: {self.hybrid_ratio!r} must be in [0, 1)")
        if self.minibatches > self.prompts_per_step * self.group_size:
            raise ConfigError("rl.num_minibatches: more minibatches than rollouts per step")
        if self.reward_rules is not None and not Path(self.reward_rules).is_file():
            raise ConfigError(f"rl.reward_rules: no such file {self.reward_rules!r}")
        if self.reward_fn is not None:
            if self.reward_rules is not None:
                raise ConfigError("rl.reward_fn: give it or rl.reward_rules, not both")
            from rlstream.trainers.rewards import RewardConfigError, load_reward_fn

            try:
                load_reward_fn(self.reward_fn)
            except RewardConfigError as exc:
                raise ConfigError(f"rl.reward_fn: {exc}") from None
        if not self.verifier_timeout_s > 0:
            raise ConfigError(f"rl.verifier_timeout_s: {self.verifier_timeout_s!r} must be > 0")

    @property
    def learning_rate(self) -> float:
        """lr, or the algorithm's default: 3e-4 for GRPO (one optimizer step per batch; at 1e-4
        seed 1 of the main job settled on a wrong borrow rule and stayed at 90.6%), 1e-4 for PPO
        (epochs x minibatches = 40 steps per batch; at 3e-4 it collapses)."""
        return self.lr or (1e-4 if self.algo == "ppo" else 3e-4)

    @property
    def epochs(self) -> int:
        """update_epochs, or the algorithm's default (left unset, it follows rl.algo)."""
        return self.update_epochs or (10 if self.algo == "ppo" else 1)

    @property
    def minibatches(self) -> int:
        """num_minibatches, or the algorithm's default."""
        return self.num_minibatches or (4 if self.algo == "ppo" else 1)


@dataclass
class SelectionConfig:
    sampler: str = "ppm"
    """prompt sampler: ppm (predictive, reads the policy), uniform, greso, mopps (for DAPO's
    dynamic sampling set rl.filter_zero_variance=true with any of them)"""
    ppm_features: str = "auto"
    """what the ppm sampler's predictive model reads besides the shared history (attempts,
    successes, version gap, neighbourhood pass rates), comma-separated: minilm (a sentence
    embedding of the prompt), text (char n-grams), hidden (the policy's last hidden state at
    the prompt), confidence (its probability of its own greedy answer, one greedy decode) —
    none reads an answer — or reference (its probability of the reference answer: a labelled
    variant). auto: the best reference-free set the selection bench measured for the data's
    answer format (policy_features.AUTO_FEATURES): confidence, with or without a chain of
    thought (README)"""
    ppm_from: str = ""
    """a run id of this stack whose PPM (scheduler snapshot) and prompt collection (Qdrant)
    warm-start this run's predictor (`rlstream run --ppm-from RUN_ID`)"""
    ppm_candidates: int = 128
    """prompts the ppm sampler scores for each batch it picks (at least the batch): more
    find more informative prompts when few are left, at the cost of scoring them (policy
    features read the policy once per candidate)"""
    ppm_candidates_max: int = 0
    """while fewer than a batch's predicted picks reach the informative threshold, the ppm
    sampler scores ppm_candidates more, up to this many (at most ppm_candidates: never more),
    so the scoring cost follows how scarce informative prompts are. 0: by the answer format
    (policy_features.FORMAT_TUNING: 512 with a chain of thought, where it took the wasted
    share to 0.37x of uniform's; none beyond ppm_candidates for direct answers, where it cost
    steps)"""
    ppm_fill: str = "auto"
    """how the ppm sampler fills a batch when too few candidates reach the informative
    threshold: rank (as it ranks the informative ones, the hard side first), value (the
    likeliest informative first) or auto (by the answer format: value with a chain of
    thought, rank with direct answers; policy_features.FORMAT_TUNING)"""
    ppm_explore_share: float | None = None
    """share of each batch the ppm sampler spends checking candidates it predicts out of reach
    (drawn uniformly among them), so its predictions stay calibrated where selection alone
    never looks (test-time allocation relies on them). None: by the answer format
    (policy_features.FORMAT_TUNING: 0.05 with a chain of thought, 0 with direct answers)"""
    ppm_pseudo_count: float | None = None
    """successes and as many failures the PPM's fit adds to every group (0.5: Jeffreys'
    prior), so a prompt it has seen fail is predicted unlikely, not impossible. None: by the
    answer format (policy_features.FORMAT_TUNING: 0.5 with a chain of thought, 0 with direct
    answers)"""
    ppm_zero_shot: bool = True
    """the PPM starts from its featurizer's own estimate of the pass rate (confidence: the
    policy's probability of its greedy answer; reference: of the reference answer) and learns
    the correction to it, so its first picks are informed before any outcome; false: it
    starts from a random network (features without such an estimate, minilm, text, hidden,
    always do)"""

    ppm_acquisition: str = "expected"
    """how the ppm sampler values a candidate from its Beta posterior: expected (the
    posterior predictive probability that its group of G is informative, in closed form: a
    prompt the PPM is unsure of scores lower) or thompson (one draw from the posterior)"""
    ppm_prior: str = "fit"
    """what a PPM prediction is worth in each prompt's Beta posterior: fit (per task family,
    the beta-binomial strength that makes the outcomes seen so far likeliest given the
    predictions made before them: how far true pass rates scatter around a prediction) or
    skill (ppm_prior_strength, scaled down by the PPM's measured Brier skill)"""
    ppm_hard_tilt: float = 2.0
    """the ppm sampler ranks candidates by E[P(group informative) x (1 - theta)^hard_tilt]:
    > 0 leans to the hard-but-solvable side of the informative band: with the expected
    acquisition it costs little waste (mixed CoT pool 0.54x of uniform's against 0.52x at 0)
    and the PPM, trained on those outcomes, guides test-time allocation (26.9% saved against
    15.3% at 0); 0 ranks by P(group informative) alone"""

    ppm_prior_strength: float = 16.0
    """with ppm_prior=skill: rollouts a PPM prediction is worth in each prompt's Beta
    posterior at full measured skill (the skill gate scales it down)"""

    def __post_init__(self):
        from rlstream.trainers.selection.policy_features import PPM_FEATURES, check_features
        from rlstream.trainers.selection.registry import loop_samplers

        _at_least("selection", "ppm_candidates", self.ppm_candidates, 1)
        _at_least("selection", "ppm_candidates_max", self.ppm_candidates_max, 0)
        if self.ppm_hard_tilt < 0:
            raise ConfigError(
                f"selection.ppm_hard_tilt: {self.ppm_hard_tilt}; a power, 0 or more (0: no tilt)"
            )
        _choice("selection", "ppm_acquisition", self.ppm_acquisition, ("expected", "thompson"))
        _choice("selection", "ppm_prior", self.ppm_prior, ("fit", "skill"))
        _choice("selection", "ppm_fill", self.ppm_fill, ("auto", "rank", "value"))
        if self.ppm_pseudo_count is not None and self.ppm_pseudo_count < 0:
            raise ConfigError(
                f"selection.ppm_pseudo_count: {self.ppm_pseudo_count}; observations, 0 or more "
                "(0.5: Jeffreys' prior), or none (by the answer format)"
            )
        if self.ppm_explore_share is not None and not 0 <= self.ppm_explore_share <= 0.5:
            raise ConfigError(
                f"selection.ppm_explore_share: {self.ppm_explore_share}; a share of the batch in "
                "[0, 0.5], or none (by the answer format)"
            )
        if not self.ppm_prior_strength > 0:
            raise ConfigError(
                f"selection.ppm_prior_strength: {self.ppm_prior_strength}; rollouts a prediction "
                "is worth, more than 0 (16: the tuned default)"
            )

        if self.sampler == "dapo":
            raise ConfigError(
                "selection.sampler: for DAPO's dynamic sampling set rl.filter_zero_variance=true "
                f"with any of {', '.join(loop_samplers())}"
            )
        _choice("selection", "sampler", self.sampler, loop_samplers())
        try:
            if self.ppm_features != "auto":
                check_features(self.ppm_features)
        except ValueError:
            raise ConfigError(
                f"selection.ppm_features: {self.ppm_features!r}; auto, or comma-separated "
                f"from {', '.join(PPM_FEATURES)}"
            ) from None
        if self.ppm_from and self.sampler != "ppm":
            raise ConfigError(
                f"selection.ppm_from warm-starts the ppm sampler's predictor; this run's "
                f"sampler is {self.sampler}: drop --ppm-from or use --sampler ppm"
            )


@dataclass
class EvalConfig:
    prompts: int = 256
    """held-out prompts evaluated (never trained on)"""
    samples: int = 8
    """samples per prompt for pass@1"""
    interval: int = 25
    """RL steps between held-out evaluations"""

    def __post_init__(self):
        _at_least("eval", "prompts", self.prompts, 1)
        _at_least("eval", "samples", self.samples, 0)
        _at_least("eval", "interval", self.interval, 1)


@dataclass
class CheckpointConfig:
    every: int = 10
    """steps between checkpoints (streaming: RL steps; consumer offsets are committed right
    after each)"""
    keep_last: int = 3
    """checkpoints retained"""
    keep_policies: int = 8
    """streaming: the newest policy versions kept in the object store (followers load the
    newest; older ones are deleted as new ones are published, so the store stays bounded)"""
    keep_policy_every: int = 100
    """streaming: every N-th policy version is kept for good besides the newest and version 0
    (`rlstream export --version`, the MLflow registry); 0 keeps none of them"""

    def __post_init__(self):
        _at_least("checkpoint", "every", self.every, 1)
        _at_least("checkpoint", "keep_last", self.keep_last, 1)
        _at_least("checkpoint", "keep_policies", self.keep_policies, 1)
        _at_least("checkpoint", "keep_policy_every", self.keep_policy_every, 0)


@dataclass
class LoopConfig:
    """The streaming loop's transport and processes (ignored in-process)."""

    rollout_workers: int = 2
    """rollout worker processes"""
    target_in_flight: int = 96
    """rollout requests in flight (issued, not yet trained on): the scheduler's pacing bound"""
    publish_every: int = 1
    """RL steps between policy versions published to the rollout workers"""
    session_timeout_ms: int = 6000
    """consumer-group session timeout"""
    max_restarts: int = 5
    """restarts of one process within restart_window_s before the supervisor gives up on it"""
    restart_window_s: float = 600.0
    """the window max_restarts counts in (a process that crashes rarely is always restarted)"""
    s3_retry_s: float = 120.0
    """how long the loop's processes retry an unavailable S3 server before failing"""
    durable_stack: bool = False
    """the embedded stack's broker keeps its log in the stack's S3 server, so a stopped run can
    be resumed (`--resume` finds its topics) and broker memory stays flat; false (the default):
    in memory, lost when the run ends. The durable log costs throughput on this broker: every
    record is two S3 writes, and every fetch lists the partition's whole log, so each fetch
    costs more as the run goes on (README: 2.5x slower from the start on 2 cores, falling)"""

    def __post_init__(self):
        _at_least("loop", "rollout_workers", self.rollout_workers, 1)
        _at_least("loop", "target_in_flight", self.target_in_flight, 1)
        _at_least("loop", "publish_every", self.publish_every, 1)
        _at_least("loop", "max_restarts", self.max_restarts, 0)
        _at_least("loop", "restart_window_s", self.restart_window_s, 1)
        _at_least("loop", "s3_retry_s", self.s3_retry_s, 0)


@dataclass
class TrackingConfig:
    """Experiment tracking (optional)."""

    mlflow_uri: str | None = None
    """an MLflow tracking server (http://host:port) or store; unset: $MLFLOW_TRACKING_URI when
    set, else no tracking"""
    experiment: str = "rlstream"
    """the MLflow experiment runs are logged under"""
    model_name: str = "rlstream-policy"
    """the registered model every published policy version becomes a version of"""


@dataclass
class Config:
    run_id: str = "run"
    """names the run's rows on every topic, its consumer groups and object-store prefixes"""
    seed: int = 0
    """seed of splits, corpus, init and sampling"""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def ppm_feature_spec(self) -> str:
        """selection.ppm_features, `auto` resolved by the data's answer format."""
        from rlstream.trainers.selection.policy_features import AUTO_FEATURES

        spec = self.selection.ppm_features
        return AUTO_FEATURES[self.data.format] if spec == "auto" else spec

    def group(self, role: str) -> str:
        """The consumer group (faust app id) of a role in this run."""
        return f"rlstream-{self.run_id}-{role}"

    def threads(self, streaming: bool) -> int:
        return self.model.threads or (1 if streaming else 2)

    def write(self, path: Path) -> Path:
        """The effective config as JSON (what every process of a run reads)."""
        path.write_text(json.dumps(to_dict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> Config:
        return load_config(path)


# --- reading, overriding, showing ------------------------------------------------------------


def to_dict(cfg) -> dict:
    return asdict(cfg)


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict, where: str = ""):
    """A `cls` from nested plain data; an unknown key is a ConfigError listing the known ones."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints, known = _hints(cls), {f.name for f in fields(cls)}
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            raise ConfigError(f"unknown setting {path!r}; known here: {', '.join(sorted(known))}")
        kind = hints[key]
        if is_dataclass(kind):
            values[key] = from_dict(kind, value, path)
        else:
            values[key] = _coerce(path, kind, value)
    return cls(**values)


def _coerce(path: str, kind, value):
    """A value of the field's type (from YAML/JSON or a --set string)."""
    args = typing.get_args(kind)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), kind) if args else kind
    if isinstance(value, str) and optional and value.lower() in ("", "none", "null"):
        return None
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: needs a {base.__name__}, got nothing")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base is int and isinstance(value, float) and value != int(value):
            raise ValueError
        if base in (int, float) and isinstance(value, bool):
            raise ValueError
        return base(value)
    except (TypeError, ValueError):
        article = "an" if base.__name__[0] in "aeiou" else "a"
        raise ConfigError(f"{path}: {value!r} is not {article} {base.__name__}") from None


def leaf_names(cls=Config, where: str = "") -> dict[str, str]:
    """Every setting's dotted name -> its type name."""
    out = {}
    for f in fields(cls):
        path = f"{where}.{f.name}" if where else f.name
        kind = _hints(cls)[f.name]
        if is_dataclass(kind):
            out |= leaf_names(kind, path)
        else:
            out[path] = getattr(kind, "__name__", str(kind))
    return out


def resolve_name(name: str, cls=Config) -> str:
    """A dotted setting name; a bare leaf name (`corpus_docs`) is accepted when unambiguous."""
    names = leaf_names(cls)
    if name in names:
        return name
    matches = [n for n in names if n.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"--set {name}: ambiguous; use one of {', '.join(matches)}")
    close = [n for n in names if name in n]
    hint = f" (did you mean {', '.join(close[:4])}?)" if close else " (see `rlstream config show`)"
    raise ConfigError(f"--set {name}: unknown setting{hint}")


def parse_overrides(items: list[str], cls=Config) -> dict:
    """['rl.lr=3e-5', 'corpus_docs=2000'] -> a nested dict of raw values."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected NAME=VALUE, e.g. --set rl.lr=3e-5")
        node = out
        *parents, leaf = resolve_name(key.strip(), cls).split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = raw
    return out


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_file(path: str | Path) -> dict:
    """A YAML (.yaml/.yml) or JSON file's mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001  (any parse error becomes one line)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"--config {path}: not valid {path.suffix[1:] or 'JSON'}: {first}"
        ) from None
    return data


def nested(dotted: dict) -> dict:
    """{'rl.steps': 5, 'seed': 1} -> {'rl': {'steps': 5}, 'seed': 1} (None values dropped)."""
    out: dict = {}
    for name, value in dotted.items():
        if value is None:
            continue
        node = out
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] = (),
    options: dict | None = None,
    cls=Config,
    base=None,
):
    """Defaults (or `base`, e.g. a benchmark's preset) < the YAML/JSON file < `options`
    (dotted name -> value, e.g. a command's own flags; None = not given) < `--set` overrides."""
    data = merge(to_dict(base) if base is not None else {}, read_file(path) if path else {})
    data = merge(data, nested(options or {}))
    data = merge(data, parse_overrides(list(overrides), cls))
    if cls is Config and base is None:
        data = format_defaults(data)
    return from_dict(cls, data)


FORMAT_DEFAULTS = {"cot": {"model": {"block_size": 96}, "rl": {"max_new_tokens": 64}}}
"""Settings whose default follows data.format: a worked solution (the longest built-in one,
countdown's, is 50 characters, the prompt up to 13) does not fit the 32-token context and
8-token completions of bare answers."""


def format_defaults(data: dict) -> dict:
    """`data` (a config as nested dicts) with FORMAT_DEFAULTS for its data.format filled in
    where no layer (file, flag, --set) gave the setting."""
    section = data.get("data", {})  # anything but a mapping: from_dict says what is wrong
    fmt = section.get("format", DataConfig.format) if isinstance(section, dict) else None
    return merge(FORMAT_DEFAULTS.get(fmt, {}), data)


def with_values(cfg, **dotted) -> Any:
    """A copy of cfg with dotted settings replaced: with_values(cfg, **{"rl.steps": 4})."""
    return from_dict(type(cfg), merge(to_dict(cfg), nested(dotted)))


def show(cfg) -> str:
    """The effective config as YAML (the shape `--config` reads)."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cls=Config, where: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, docstring) of every setting, from the dataclasses' docstrings."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:], strict=False):
        doc = getattr(nxt, "value", None)
        if isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Constant):
            docs[node.target.id] = " ".join(str(doc.value).split())
    out = []
    for f in fields(cls):
        path = f"{where}.{f.name}" if where else f.name
        kind = _hints(cls)[f.name]
        if is_dataclass(kind):
            out += describe(kind, path)
        else:
            default = f.default if f.default is not MISSING else f.default_factory()
            out.append((path, repr(default), docs.get(f.name, "")))
    return out


__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "LoopConfig",
    "ModelConfig",
    "PretrainConfig",
    "RLConfig",
    "SelectionConfig",
    "describe",
    "from_dict",
    "load_config",
    "nested",
    "parse_overrides",
    "show",
    "to_dict",
    "with_values",
]
