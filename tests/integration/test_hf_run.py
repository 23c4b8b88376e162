"""A user's Hugging Face checkpoint through the live loop: `rlstream run --model DIR` on the real
broker and S3 server trains a tiny random Qwen2 (byte-level BPE tokenizer, no pad token); every
policy version is a Hugging Face directory in the object store; `rlstream export` writes one
that plain transformers loads and generates with.

The same run checks that secrets stay secret: with the stack's S3 keys and a broker password in
its environment, it leaves neither in any file it writes (logs, report, summary, configs, live
figures, checkpoints), on any metrics page or on any process's command line, and its servers
and metrics endpoints listen on loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
import torch

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.streams.policystore import stored_versions
from tests.hf_models import tiny_model_dir, weights
from tests.integration.conftest import cli

pytestmark = pytest.mark.integration
RUN = "hf-it"
PASSWORD = "broker-pw-7f3a9c"  # a broker credential: unused on the PLAINTEXT broker, still secret
SMALL = [
    *("--rl-steps", "4", "--set", "pretrain.max_steps=20", "--set", "pretrain.batch=32"),
    *("--set", "eval.prompts=16"),
    *("--set", "prompts_per_step=8", "--set", "group_size=4", "--set", "eval.interval=2"),
    *("--set", "data.corpus_docs=2000", "--set", "data.pool_size=200"),
    *("--set", "target_in_flight=16", "--set", "model.block_size=48"),
    *("--set", "checkpoint.every=1"),
]
LOAD = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tok(["037+085="], return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
assert "rlstream" not in sys.modules
print(model.config.model_type, out.shape[1] - ids.shape[1])
"""


@dataclass
class Watched:
    """What a run left and what could be seen of it while it ran."""

    model: Path
    out: Path
    seen: dict[str, str] = field(default_factory=dict)  # command lines, metrics pages, files
    listening: set[tuple[str, int]] = field(default_factory=set)
    carried: set[int] = field(default_factory=set)  # processes that got the password


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _look(run: subprocess.Popen, w: Watched) -> None:
    for proc in _tree(run.pid):
        try:
            w.seen[f"cmdline {proc.pid}"] = " ".join(proc.cmdline())
            if proc.environ().get("RLSTREAM_KAFKA_PASSWORD") == PASSWORD:
                w.carried.add(proc.pid)
            w.listening |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp")
                            if c.status == psutil.CONN_LISTEN}  # fmt: skip
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    pages = w.out / RUN / "metrics.json"
    if pages.exists():
        for name, url in json.loads(pages.read_text()).items():
            with contextlib.suppress(httpx.HTTPError):
                w.seen[f"metrics {name}"] = httpx.get(url, timeout=2).text


@pytest.fixture(scope="module")
def watched(stack_home, tmp_path_factory) -> Watched:
    """`rlstream run --model DIR` to its end, watched every half second."""
    home = tmp_path_factory.mktemp("hf-run")
    w = Watched(tiny_model_dir(home / "qwen", "qwen2"), home / "runs")
    env = os.environ | {"RLSTREAM_KAFKA_USERNAME": "trainer", "RLSTREAM_KAFKA_PASSWORD": PASSWORD}
    args = [sys.executable, "-m", "rlstream.cli", "run", "--model", str(w.model), "--run-id", RUN,
            "--out", str(w.out), *SMALL]  # fmt: skip
    log = home / "run.log"
    with open(log, "w") as sink:
        run = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 900
    while run.poll() is None and time.monotonic() < deadline:
        _look(run, w)
        time.sleep(0.5)
    if run.poll() is None:
        run.kill()
    assert run.wait(timeout=60) == 0, log.read_text()[-3000:]
    w.seen["stdout"] = log.read_text()
    return w


def test_a_users_model_trains_in_the_live_loop_and_exports_for_transformers(
    watched, endpoints, tmp_path
):
    store = ObjectStore(endpoints)
    store.put_bytes(f"{RUN}/policies/version=999999/config.json", b"{}")  # an upload cut short
    versions = stored_versions(store, RUN)
    assert len(versions) >= 5  # the pre-trained policy and one per RL step
    assert 999999 not in versions  # incomplete: no rlstream.json, which goes last
    exported = tmp_path / "exported"
    runs = str(watched.out)
    shown = cli("export", RUN, "--out", str(exported), "--runs", runs).stdout
    assert f"version {max(versions)}" in shown
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in exported.iterdir()
    }
    before, after = weights(watched.model), weights(exported)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    done = subprocess.run([sys.executable, "-c", LOAD, str(exported)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind, new = done.stdout.split()
    assert kind == "qwen2" and 1 <= int(new) <= 5
    first = tmp_path / "first"
    cli("export", RUN, "--out", str(first), "--runs", runs, "--version", str(min(versions)))
    assert any(not torch.equal(weights(first)[k], after[k]) for k in after)
    missing = cli("export", RUN, "--out", str(tmp_path / "x"), "--version", "999", check=False)
    assert missing.returncode == 2 and "--version 999" in missing.stderr


def test_a_frozen_policy_version_of_the_run_plays_the_llm_user(watched, tmp_path):
    """`user_model: policy:RUN@VERSION` reads that version from the object store: the user it
    plays answers as the same version exported to a directory does (greedy, so exactly)."""
    import asyncio

    from rlstream.config import EnvConfig
    from rlstream.trainers.environments.llm_user import LLMUser
    from rlstream.trainers.envs import Prompt

    store = ObjectStore(Endpoints.from_env())
    version = min(stored_versions(store, RUN))
    exported = tmp_path / "frozen"
    cli("export", RUN, "--out", str(exported), "--runs", str(watched.out),
        "--version", str(version))  # fmt: skip
    prompt = Prompt("p", "037+085=", "exact", 0, "122", environment="llm-user")

    def reply(user_model: str):
        options = {"user_model": user_model, "user_max_new_tokens": 6}
        user = LLMUser(EnvConfig(max_turns=3, options=json.dumps(options)))

        async def play():
            await user.reset(prompt)
            return await user.step("is it 100?")

        return asyncio.run(play())

    frozen = reply(f"policy:{RUN}@{version}")
    assert not frozen.done and frozen.observation.endswith("\n")
    assert frozen.observation == reply(str(exported)).observation
    with pytest.raises(ValueError, match=f"policy:{RUN}@VERSION with one of"):
        reply(f"policy:{RUN}@999")


def test_no_secret_reaches_a_file_a_metrics_page_or_a_command_line(watched):
    endpoints = Endpoints.from_env()
    secrets = [endpoints.s3_secret_key, endpoints.s3_access_key, PASSWORD]
    assert all(len(s) >= 8 for s in secrets)
    assert len(watched.carried) >= 4  # the run and its children held it (by environment)
    assert any(k.startswith("metrics ") for k in watched.seen)
    files = [p for p in watched.out.rglob("*") if p.is_file()]
    assert len(files) > 10 and any(p.name == "report.md" for p in files)
    seen = dict(watched.seen)
    for path in files:
        seen[f"file {path.relative_to(watched.out)}"] = path.read_bytes().decode("latin-1")
    leaks = [(where, s) for where, text in seen.items() for s in secrets if s in text]
    assert not leaks, leaks
    listening = watched.listening
    assert listening and all(ip in ("127.0.0.1", "::1") for ip, _ in listening), listening


def test_the_stacks_key_files_are_owner_only(stack_home):
    for name in ("endpoints.json", "secrets.json"):
        found = list(Path(stack_home).rglob(name))
        assert found, name
        assert all(p.stat().st_mode & 0o077 == 0 for p in found), found
