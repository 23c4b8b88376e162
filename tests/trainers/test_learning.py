"""CPU learning test: pre-training lands in the 20-60% window, RL then lifts greedy and pass@1."""

import pytest

from rlstream.config import load_config
from rlstream.trainers.local import LocalOptions, train_local


@pytest.mark.slow
@pytest.mark.timeout(480)  # ~1-2 min alone; the 2 cores may be shared
def test_rl_improves_held_out_greedy_and_pass1(tmp_path):
    cfg = load_config(
        None,
        [
            "data.tasks=add@2,sub@2",  # two-digit add/sub, zero-padded, digit-reversed answers
            "data.flaw_rate=0.65",  # dropped carries / forgotten borrows in 65% of those lines
            "model.n_layer=3",  # ~0.35M params: 2.5x faster than the default model, learns the same
            "model.n_embd=96",
            "pretrain.max_steps=1000",
            "pretrain.val_interval=100",
            "rl.steps=40",  # 44.5% -> 95.3% greedy, pass@1 48.0% -> 80.8% (60 steps: 95.3%, 83.3%)
            "eval.interval=20",
            "selection.sampler=uniform",  # the thresholds below were set with uniform selection
            "model.threads=1",  # a core of the two: the suite can run on two workers
        ],
    )
    s = train_local(cfg, LocalOptions(out_dir=str(tmp_path), progress=False))
    pre, final = s["pretrain_accuracy"], s["final_accuracy"]
    pre1, final1 = s["pretrain_pass1"], s["final_pass1"]
    print(
        f"\nheld-out greedy {pre:.1%} -> {final:.1%} ({final - pre:+.1%}); "
        f"pass@1 {pre1:.1%} -> {final1:.1%} ({final1 - pre1:+.1%}); "
        f"{s['pretrain_steps']} pre-train steps, {s['rl_steps']} RL steps, {s['wall_s']:.0f} s"
    )
    assert 0.20 <= pre <= 0.60
    assert final - pre >= 0.25
    assert final1 - pre1 >= 0.15


@pytest.mark.slow
@pytest.mark.timeout(480)  # ~2 min alone
def test_rl_fixes_the_code_familys_bugs_through_the_sandbox(tmp_path):
    """The built-in code family (`fn`): every reward is its hidden tests run in the sandbox;
    pre-training writes `/` for `//` and `^` for `**` in 65% of those documents, RL unlearns it."""
    cfg = load_config(
        None,
        [
            "data.tasks=fn",
            "data.flaw_rate=0.65",
            "model.n_layer=3",
            "model.n_embd=96",
            "pretrain.max_steps=400",
            "pretrain.val_interval=100",
            "rl.steps=12",  # 60.0% -> 100% greedy by step 10 (40 steps: the same)
            "eval.interval=12",
            "eval.prompts=64",
            "selection.sampler=uniform",
            "model.threads=1",
        ],
    )
    s = train_local(cfg, LocalOptions(out_dir=str(tmp_path), progress=False))
    pre, final = s["pretrain_accuracy"], s["final_accuracy"]
    gain = final - pre
    print(f"\nheld-out pass rate {pre:.1%} -> {final:.1%} ({gain:+.1%}), {s['wall_s']:.0f} s")
    assert pre <= 0.75  # the flawed classes fail their tests before RL
    assert final - pre >= 0.25
