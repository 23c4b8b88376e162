"""`rlstream bench train`: rlstream's training and sampling throughput on a model, each against
the plain Hugging Face way of doing the same work, measured in the same process.

- training tokens/s: the training core's update (`TorchBackend.step` on `lm_loss`: AdamW,
  gradient clipping, the scheduled learning rate) against a bare torch loop over the same
  `transformers` model (`model(input_ids, labels=...).loss`, backward, AdamW step), on the same
  (batch_size, block_size) batches; target ratio >= 0.9.
- sampling tokens/s: `rlstream.trainers.sampling.sample` (G completions per prompt, KV cache)
  against `model.generate` with the same settings (temperature, top-p, max new tokens, EOS and
  newline stops, G return sequences); target ratio >= 1.0. Also rlstream without its cache.

Repeats alternate between the two sides; median and spread (min-max) over repeats. MFU on
CUDA from the 6N + 12LCT FLOPs estimate and the device's bf16 peak.
"""

from __future__ import annotations

import statistics
import time

import torch

# Dense bf16 peak FLOP/s by device-name fragment (vendor datasheets).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}
PROMPTS, GROUP = 16, 8  # sampling: 16 prompts x 8 completions


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run_bench(
    repeats: int = 5,
    threads: int = 2,
    device: str = "auto",
    batch_size: int = 64,
    model: str = "preset:tiny",
    block_size: int = 32,
) -> dict:
    """Throughput numbers as a dict (tokens/s median/min/max per measurement, and ratios)."""
    from rlstream.config import ModelConfig
    from rlstream.trainers.backend import TorchBackend, make_adamw
    from rlstream.trainers.lm import build_model, load_tokenizer
    from rlstream.trainers.pretrain import lm_loss
    from rlstream.trainers.sampling import sample

    torch.set_num_threads(threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    a = ModelConfig(path=model, block_size=block_size)
    tok = load_tokenizer(a)
    torch.manual_seed(0)
    policy = build_model(a, tok, device=device)
    T = policy.block_size
    g = torch.Generator(device="cpu").manual_seed(0)
    low = 2 if tok.is_char else 0
    x = torch.randint(low, tok.vocab_size, (batch_size, T + 1), generator=g).to(device)
    amp = (
        torch.autocast("cuda", torch.bfloat16)
        if device == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    steps = 20 if device == "cuda" else 5
    ours = TorchBackend(policy, make_adamw(policy, 1e-4), max_grad_norm=1.0)
    bare_opt = torch.optim.AdamW(policy.lm.parameters(), lr=1e-4)

    def timed(fn) -> float:
        _sync(device)
        t = time.perf_counter()
        tokens = fn()
        _sync(device)
        return tokens / (time.perf_counter() - t)

    def train_ours() -> int:
        for _ in range(steps):
            ours.set_lr(1e-4)
            with amp:
                loss = lm_loss(policy, x[:, :-1], x[:, 1:])
            ours.step(loss)
        return steps * batch_size * T

    def train_bare() -> int:
        for _ in range(steps):
            with amp:
                loss = policy.lm(input_ids=x[:, :-1], labels=x[:, :-1]).loss
            loss.backward()
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)
        return steps * batch_size * T

    texts = ["037+085="] * PROMPTS
    new = T - len(tok.encode(texts[0]))
    stop_ids = sorted(tok.stop_ids(("\n",)))

    def sample_ours(use_cache: bool = True) -> int:
        s = sample(policy, tok, texts, GROUP, new, 1.0, stop=("\n",), use_cache=use_cache,
                   generator=torch.Generator(device=device).manual_seed(0))  # fmt: skip
        return sum(len(t_) for t_ in s.tokens)

    ids = torch.tensor([tok.encode(texts[0])] * PROMPTS, device=device)

    def sample_generate() -> int:
        out = policy.lm.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
            top_k=0, max_new_tokens=new, num_return_sequences=GROUP, eos_token_id=stop_ids,
            pad_token_id=tok.pad_id,
        )  # fmt: skip
        completion = out[:, ids.shape[1] :]
        done = torch.isin(completion, torch.tensor(stop_ids, device=device))
        # tokens up to and including the first stop, as rlstream counts them
        first = torch.where(done.any(1), done.float().argmax(1) + 1, completion.shape[1])
        return int(first.sum())

    sides = {
        "train_tokens_per_s": train_ours,
        "train_bare_torch_tokens_per_s": train_bare,
        "sample_tokens_per_s_kv_cache": sample_ours,
        "sample_generate_tokens_per_s": sample_generate,
        "sample_tokens_per_s_no_cache": lambda: sample_ours(False),
    }
    for fn in sides.values():
        fn()  # warm-up
    measured: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeats):  # alternate: drifts in machine load hit both sides alike
        for key, fn in sides.items():
            measured[key].append(timed(fn))
    res = {
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu x{threads} threads",
        "model": model,
        "architecture": policy.lm.config.model_type,
        "params": policy.num_params(),
        "batch_size": batch_size,
        "block_size": T,
        "repeats": repeats,
        **{k: _stats(v) for k, v in measured.items()},
    }
    res["train_ratio_vs_bare_torch"] = _ratio(measured, "train_tokens_per_s",
                                              "train_bare_torch_tokens_per_s")  # fmt: skip
    res["sample_ratio_vs_generate"] = _ratio(measured, "sample_tokens_per_s_kv_cache",
                                             "sample_generate_tokens_per_s")  # fmt: skip
    if device == "cuda":
        text = policy.lm.config.get_text_config()
        n, L, C = policy.num_params(), text.num_hidden_layers, text.hidden_size
        flops_per_token = 6 * n + 12 * L * C * T
        peak = next((v for k, v in PEAK_FLOPS.items() if k in res["device"]), None)
        tps = res["train_tokens_per_s"]["median"]
        res["mfu"] = flops_per_token * tps / peak if peak else None
        total = torch.cuda.get_device_properties(0).total_memory
        res["peak_memory_share"] = torch.cuda.max_memory_allocated() / total
    return res


def _ratio(measured: dict[str, list[float]], ours: str, theirs: str) -> dict:
    """Per-repeat ratios (each pair measured back to back): median and spread."""
    return _stats([a / b for a, b in zip(measured[ours], measured[theirs], strict=True)])


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    what = f"{res['model']} ({res['architecture']}, {res['params']:,} params)"
    t = Table(title=f"bench train: {what} on {res['device']}")
    for col in ("measurement", "median tokens/s", "min", "max"):
        t.add_column(col, justify="right" if col != "measurement" else "left")
    shape = f"(batch {res['batch_size']} x {res['block_size']})"
    sampled = f"({PROMPTS} prompts x {GROUP})"
    for key, label in [
        ("train_tokens_per_s", f"training, rlstream core {shape}"),
        ("train_bare_torch_tokens_per_s", f"training, bare torch loop {shape}"),
        ("sample_tokens_per_s_kv_cache", f"sampling, rlstream KV cache {sampled}"),
        ("sample_generate_tokens_per_s", f"sampling, model.generate {sampled}"),
        ("sample_tokens_per_s_no_cache", f"sampling, rlstream no cache {sampled}"),
    ]:
        s = res[key]
        t.add_row(label, f"{s['median']:,.0f}", f"{s['min']:,.0f}", f"{s['max']:,.0f}")
    for key, label in [
        ("train_ratio_vs_bare_torch", "ratio: training vs bare torch (target >= 0.9)"),
        ("sample_ratio_vs_generate", "ratio: sampling vs generate (target >= 1.0)"),
    ]:
        s = res[key]
        t.add_row(label, f"{s['median']:.2f}x", f"{s['min']:.2f}x", f"{s['max']:.2f}x")
    if res.get("mfu") is not None:
        t.add_row("MFU (bf16 peak)", f"{res['mfu']:.2%}", "", "")
    if res.get("peak_memory_share") is not None:
        t.add_row("peak GPU memory share", f"{res['peak_memory_share']:.1%}", "", "")
    import sys

    Console(width=None if sys.stdout.isatty() else 120).print(t)  # piped: whole rows
