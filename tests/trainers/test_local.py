"""The local loop end to end with tiny budgets: outputs, PPO, hybrid, reward rules."""

import json
import subprocess
import sys

import pytest

from rlstream.config import Config, load_config, with_values
from rlstream.trainers.local import LocalOptions, train_local

TINY = [
    "data.corpus_docs=2000",
    "data.pool_size=200",
    "pretrain.max_steps=20",
    "pretrain.val_interval=10",
    "pretrain.warmup_steps=5",
    "rl.steps=4",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "eval.interval=2",
    "eval.prompts=16",
    "eval.samples=2",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.threads=1",
    "model.backend=torch",
    "selection.sampler=uniform",
]


def tiny(*extra: str) -> Config:
    return load_config(None, [*TINY, *extra])


KEYS = {
    "pretrain_accuracy",
    "final_accuracy",
    "pretrain_pass1",
    "final_pass1",
    "rl_steps",
    "rollouts",
    "wall_s",
    "sampler",
    "zero_variance_share",
}


def test_grpo_run_writes_summary_history_and_curves(tmp_path):
    opts = LocalOptions(out_dir=str(tmp_path), summary=str(tmp_path / "s.json"), progress=False)
    s = train_local(tiny(), opts)
    assert set(s) >= KEYS and s["rl_steps"] == 4 and s["rollouts"] == 4 * 4 * 4
    assert s["sampler"] == "uniform"
    assert s["zero_variance_share"] is None or 0 <= s["zero_variance_share"] <= 1
    assert json.loads((tmp_path / "s.json").read_text())["rollouts"] == 64
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert Config.read(tmp_path / "config.yaml") == tiny()  # the effective config is written
    hist = json.loads((tmp_path / "history.json").read_text())
    assert {h["phase"] for h in hist} == {"pretrain", "rl"}
    assert any("val_loss" in h for h in hist) and any("entropy" in h for h in hist)


def test_ppo_hybrid_with_reward_rules(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "rules": [
                    {"type": "exact_match"},
                    {"type": "format", "pattern": "[0-9]+", "weight": 0.1},
                ]
            }
        )
    )
    cfg = with_values(
        tiny(),
        **{
            "data.tasks": "add@1,chain@1",
            "rl.algo": "ppo",
            "rl.update_epochs": 2,
            "rl.num_minibatches": 2,
            "rl.hybrid": True,
            "rl.reward_rules": str(rules),
        },
    )
    s = train_local(cfg, LocalOptions(progress=False))
    assert s["algo"] == "ppo" and s["rl_steps"] == 4
    assert s["corpus_added"] >= 0 and set(s["final_by_task"]) == {"add", "chain"}


def test_the_zero_variance_filter_refills_batches_in_process():
    # a barely pre-trained policy gets most groups all wrong: the filter rolls out more rounds
    # (up to its cap) so that every update still trains on a full batch
    s = train_local(tiny("rl.filter_zero_variance=true", "rl.filter_max_rounds=3"))
    assert s["rollouts"] == 4 * 4 * 4  # full batches of P x G trained
    assert 4 * 4 * 4 < s["rollouts_generated"] <= 3 * 4 * 4 * 4


def test_cli_trains_in_process_with_the_ppm_sampler(tmp_path):
    sets = [arg for item in TINY[:-1] for arg in ("--set", item)]
    out = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "train", *sets, "--set", "sampler=ppm",
         "--no-progress", "--summary", str(tmp_path / "s.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["sampler"] == "ppm" and s["rl_steps"] == 4 and s["rollouts"] == 4 * 4 * 4


def test_cli_train_and_bench_help():
    for cmd in (["train", "--help"], ["bench", "train", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "rlstream.cli", *cmd], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "train", "--set", "nope=1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "nope" in bad.stderr and "unknown setting" in bad.stderr


@pytest.mark.slow  # a real mlflow server and an in-process run (~18 s)
def test_an_in_process_run_is_tracked_in_mlflow(tmp_path):
    """`rlstream train --mlflow URI`: params, the history as metrics at their steps, the
    summary and the artifacts, in a real MLflow store (SQLite, in this process's reach)."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = [arg for item in TINY for arg in ("--set", item)]
    out = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "train", *sets, "--mlflow", uri, "--no-progress",
         "--set", "run_id=local-mlflow", "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rlstream")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "local-mlflow"
    assert run.data.params["rl.steps"] == "4" and run.data.params["selection.sampler"] == "uniform"
    rewards = client.get_metric_history(run.info.run_id, "rl/reward")
    assert sorted(m.step for m in rewards) == [1, 2, 3, 4]
    assert client.get_metric_history(run.info.run_id, "pretrain/val_loss")
    assert run.data.metrics["summary/rl_steps"] == 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "config.yaml", "summary.json"} <= artifacts
