"""A user's Hugging Face checkpoint through the live loop: `rlstream run --model DIR` on the real
broker and S3 server trains a tiny random Qwen2 (byte-level BPE tokenizer, no pad token); every
policy version is a Hugging Face directory in the object store; `rlstream export` writes one
that plain transformers loads and generates with."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlstream.connectors.objectstore import ObjectStore
from rlstream.streams.policystore import stored_versions
from tests.hf_models import tiny_model_dir, weights
from tests.integration.conftest import cli

pytestmark = pytest.mark.integration
RUN = "hf-it"
SMALL = [
    *("--rl-steps", "4", "--set", "pretrain.max_steps=20", "--set", "eval.prompts=16"),
    *("--set", "prompts_per_step=8", "--set", "group_size=4", "--set", "eval.interval=2"),
    *("--set", "data.corpus_docs=2000", "--set", "data.pool_size=200"),
    *("--set", "target_in_flight=16", "--set", "model.block_size=48"),
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


def test_a_users_model_trains_in_the_live_loop_and_exports_for_transformers(
    stack_home, endpoints, tmp_path
):
    model = tiny_model_dir(tmp_path / "qwen", "qwen2")
    out = tmp_path / "runs"
    cli("run", "--model", str(model), "--run-id", RUN, "--out", str(out), *SMALL, timeout=900)
    store = ObjectStore(endpoints)
    store.put_bytes(f"{RUN}/policies/version=999999/config.json", b"{}")  # an upload cut short
    versions = stored_versions(store, RUN)
    assert len(versions) >= 5  # the pre-trained policy and one per RL step
    assert 999999 not in versions  # incomplete: no rlstream.json, which goes last
    exported = tmp_path / "exported"
    shown = cli("export", RUN, "--out", str(exported), "--runs", str(out)).stdout
    assert f"version {max(versions)}" in shown
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in exported.iterdir()
    }
    before, after = weights(model), weights(exported)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    done = subprocess.run([sys.executable, "-c", LOAD, str(exported)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind, new = done.stdout.split()
    assert kind == "qwen2" and 1 <= int(new) <= 5
    first = tmp_path / "first"
    cli("export", RUN, "--out", str(first), "--runs", str(out), "--version", str(min(versions)))
    assert any(not torch.equal(weights(first)[k], after[k]) for k in after)
    missing = cli("export", RUN, "--out", str(tmp_path / "x"), "--version", "999", check=False)
    assert missing.returncode == 2 and "--version 999" in missing.stderr
