"""Checkpoint store and the resume guarantee: SIGKILL mid-run, resume, match the full run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstream.trainers.checkpoint import (
    DirectoryStore,
    from_bytes,
    latest_checkpoint,
    save_checkpoint,
)


def test_directory_store_and_retention(tmp_path):
    store = DirectoryStore(tmp_path / "ck")
    for step in (5, 10, 15, 20):
        save_checkpoint(store, step, {"x": step}, keep_last=2)
    assert store.list() == ["step-00000015.pt", "step-00000020.pt"]
    state = latest_checkpoint(store)
    assert state["x"] == 20 and state["step"] == 20 and "torch" in state["rng"]
    assert from_bytes(store.load_bytes("step-00000015.pt"))["x"] == 15
    assert latest_checkpoint(DirectoryStore(tmp_path / "empty")) is None


TINY = [
    "--tasks",
    "add@1-2,sub@1-2",
    "--pretrain-max-steps",
    "30",
    "--rl-steps",
    "20",
    "--threads",
    "1",
    "--no-progress",
    "--backend",
    "torch",
    "--sampler",
    "uniform",
    "--set",
    "data.corpus_docs=3000",
    "--set",
    "pretrain.val_interval=10",
    "--set",
    "eval.prompts=32",
    "--set",
    "data.pool_size=300",
    "--set",
    "eval.interval=10",
    "--set",
    "rl.prompts_per_step=8",
    "--set",
    "model.n_layer=2",
    "--set",
    "model.n_embd=64",
    "--set",
    "warmup_steps=5",  # a bare leaf name resolves to pretrain.warmup_steps
]


def _cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlstream.cli",
        "train",
        *TINY,
        "--out-dir",
        str(out),
        "--summary",
        str(out / "summary.json"),
        *extra,
    ]


def _losses(out: Path) -> list[tuple]:
    hist = json.loads((out / "history.json").read_text())
    return [(h["phase"], h["step"], h.get("loss"), h.get("greedy")) for h in hist]


@pytest.mark.slow  # a subprocess trains, is SIGKILLed and resumes (~35 s)
@pytest.mark.timeout(300)
def test_sigkill_and_resume_matches_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    subprocess.run(_cmd(full), check=True, timeout=240)

    part, ck = tmp_path / "part", tmp_path / "part" / "ck"
    cmd = _cmd(part, "--checkpoint-dir", str(ck), "--set", "checkpoint.every=5")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = ck / "step-00000035.pt"  # 30 pre-training steps + 5 RL steps
    deadline = time.time() + 200
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert target.exists(), proc.stderr.read().decode()[-2000:]
    assert not (part / "summary.json").exists(), "the run finished before it was killed"

    subprocess.run(cmd + ["--resume"], check=True, timeout=240)
    a = json.loads((full / "summary.json").read_text())
    b = json.loads((part / "summary.json").read_text())
    for key in (
        "pretrain_accuracy",
        "pretrain_pass1",
        "final_accuracy",
        "final_pass1",
        "rl_steps",
        "rollouts",
        "final_by_task",
    ):
        assert a[key] == b[key], key
    assert _losses(full) == _losses(part)  # every step's loss, bit for bit


def test_resume_from_a_pretraining_checkpoint_in_process():
    from rlstream.config import load_config
    from rlstream.trainers.checkpoint import MemoryStore
    from rlstream.trainers.local import LocalOptions, train_local

    cfg = load_config(
        None,
        [
            "data.tasks=add@1-2",
            "data.corpus_docs=1000",
            "pretrain.max_steps=12",
            "pretrain.val_interval=4",
            "pretrain.warmup_steps=2",
            "rl.steps=4",
            "eval.interval=2",
            "eval.prompts=8",
            "eval.samples=2",
            "rl.prompts_per_step=4",
            "rl.group_size=2",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.threads=1",
            "model.backend=torch",
            "checkpoint.every=4",
            "checkpoint.keep_last=10",
            "selection.sampler=uniform",
        ],
    )
    full_store = MemoryStore()
    full = train_local(cfg, LocalOptions(progress=False), store=full_store)
    assert full_store.list()[0] == "step-00000004.pt"
    partial = MemoryStore()  # as if the run died right after its step-8 checkpoint
    partial.save_bytes("step-00000008.pt", full_store.load_bytes("step-00000008.pt"))
    resumed = train_local(cfg, LocalOptions(resume=True, progress=False), store=partial)
    for key in ("pretrain_accuracy", "final_accuracy", "final_pass1", "rollouts"):
        assert full[key] == resumed[key], key
    assert partial.list() == full_store.list()[1:]  # every checkpoint from step 8 on
    last = full_store.list()[-1]
    a, b = from_bytes(full_store.load_bytes(last)), from_bytes(partial.load_bytes(last))
    assert all(a["model"][k].equal(b["model"][k]) for k in a["model"])
