"""DeepSpeed ZeRO-2 on CPU: a few optimizer steps through the backend change the parameters.

The first run JIT-builds DeepSpeed's shm-comm op (~1 min, cached in TORCH_EXTENSIONS_DIR);
a client torch AdamW avoids building the fused Adam op. Deselect with -m "not deepspeed".
"""

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.deepspeed


@pytest.fixture(autouse=True)
def _deepspeed_env(monkeypatch):
    pytest.importorskip("deepspeed")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlstream"
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))


@pytest.mark.slow  # DeepSpeed builds its CPU op and trains (~60 s)
@pytest.mark.timeout(300)
def test_zero2_cpu_smoke():
    from rlstream.config import ModelConfig
    from rlstream.trainers.backend import make_adamw, make_backend
    from rlstream.trainers.lm import Tokenizer, build_model
    from rlstream.trainers.pretrain import Corpus, lm_loss

    tok = Tokenizer.char()
    torch.manual_seed(0)
    model = build_model(ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=32), tok)
    backend = make_backend(model, make_adamw(model, 1e-2), "deepspeed", zero_stage=2)
    assert backend.name == "deepspeed"
    corpus = Corpus(["12+34=64\n", "5-3=2\n", "7+7=41\n"], tok, 16)
    g = torch.Generator().manual_seed(0)
    before = [p.detach().clone() for p in backend.module.parameters()]
    losses = []
    for _ in range(5):
        x, y = corpus.batch(8, g)
        loss = lm_loss(backend.model, x, y)
        backend.step(loss)
        losses.append(float(loss.detach()))
    after = list(backend.module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert losses[-1] < losses[0]


@pytest.mark.slow  # the in-process loop on a DeepSpeed engine (~25 s with its first start)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_local_loop_on_deepspeed_checkpoints_and_resumes(tmp_path, algo):
    from rlstream.config import load_config
    from rlstream.trainers.local import LocalOptions, train_local

    settings = [
        "data.tasks=add@1",
        f"rl.algo={algo}",
        "data.corpus_docs=500",
        "pretrain.max_steps=6",
        "pretrain.val_interval=3",
        "pretrain.warmup_steps=2",
        "eval.interval=3",
        "eval.prompts=8",
        "eval.samples=2",
        "rl.prompts_per_step=2",
        "rl.group_size=2",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.threads=1",
        "model.backend=deepspeed",
        "checkpoint.every=3",
        "selection.sampler=uniform",
    ]
    ck = str(tmp_path)
    s = train_local(
        load_config(None, [*settings, "rl.steps=3"]),
        LocalOptions(checkpoint_dir=ck, progress=False),
    )
    assert s["rl_steps"] == 3
    s = train_local(
        load_config(None, [*settings, "rl.steps=5"]),
        LocalOptions(checkpoint_dir=ck, resume=True, progress=False),
    )
    assert s["rl_steps"] == 5
