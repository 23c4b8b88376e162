"""The local loop end to end with tiny budgets: outputs, PPO, hybrid, reward rules."""

import json
import subprocess
import sys

from rlstream.trainers.local import Args, train_local

TINY = dict(
    corpus_docs=2000,
    pretrain_max_steps=20,
    val_interval=10,
    warmup_steps=5,
    rl_steps=4,
    eval_interval=2,
    eval_prompts=16,
    eval_samples=2,
    pool_size=200,
    prompts_per_step=4,
    group_size=4,
    n_layer=1,
    n_embd=32,
    threads=1,
    progress=False,
    backend="torch",
)

KEYS = {
    "pretrain_accuracy",
    "final_accuracy",
    "pretrain_pass1",
    "final_pass1",
    "rl_steps",
    "rollouts",
    "wall_s",
}


def test_grpo_run_writes_summary_history_and_curves(tmp_path):
    s = train_local(Args(**TINY, out_dir=str(tmp_path), summary=str(tmp_path / "s.json")))
    assert set(s) >= KEYS and s["rl_steps"] == 4 and s["rollouts"] == 4 * 4 * 4
    assert json.loads((tmp_path / "s.json").read_text())["rollouts"] == 64
    assert (tmp_path / "curves.png").stat().st_size > 10_000
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
    args = Args(
        **TINY | {"tasks": "add@1,chain@1"},
        algo="ppo",
        update_epochs=2,
        num_minibatches=2,
        hybrid=True,
        reward_rules=str(rules),
    )
    s = train_local(args)
    assert s["algo"] == "ppo" and s["rl_steps"] == 4
    assert s["corpus_added"] >= 0 and set(s["final_by_task"]) == {"add", "chain"}


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
    assert bad.returncode != 0 and "nope=1" in bad.stderr
