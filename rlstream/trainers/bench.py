"""`rlstream bench train`: training and sampling throughput of the default model.

Training tokens/s: forward + backward + AdamW step on (batch_size, block_size) sequences.
Sampling tokens/s: new tokens generated for 16 prompts x 8 completions, with and without the KV
cache. Median and spread (min-max) over repeats; MFU on CUDA from nanoGPT's FLOPs estimate.
"""

from __future__ import annotations

import statistics
import time

import torch

# Dense bf16 peak FLOP/s by device-name fragment (vendor datasheets).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run_bench(
    repeats: int = 5, threads: int = 2, device: str = "auto", batch_size: int = 64
) -> dict:
    """Throughput numbers as a dict (tokens/s median/min/max per measurement)."""
    from rlstream.config import ModelConfig
    from rlstream.trainers.backend import make_adamw
    from rlstream.trainers.model import GPT, CharTokenizer, GPTConfig
    from rlstream.trainers.pretrain import lm_loss
    from rlstream.trainers.sampling import sample

    torch.set_num_threads(threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    a, tok = ModelConfig(), CharTokenizer()
    cfg = GPTConfig(tok.vocab_size, a.block_size, a.n_layer, a.n_head, a.n_embd)
    model = GPT(cfg).to(device)
    opt = make_adamw(model, 1e-3)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(2, tok.vocab_size, (batch_size, a.block_size + 1), generator=g).to(device)
    amp = (
        torch.autocast("cuda", torch.bfloat16)
        if device == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    steps = 20 if device == "cuda" else 5

    def train_once() -> float:
        _sync(device)
        t = time.perf_counter()
        for _ in range(steps):
            with amp:
                loss = lm_loss(model, x[:, :-1], x[:, 1:], tok.pad_id)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        return steps * batch_size * a.block_size / (time.perf_counter() - t)

    prompts = ["037+085="] * 16
    new = a.block_size - len(prompts[0])

    def sample_once(use_cache: bool) -> float:
        _sync(device)
        t = time.perf_counter()
        s = sample(
            model,
            tok,
            prompts,
            8,
            new,
            1.0,
            stop=("\x7e",),
            use_cache=use_cache,
            generator=torch.Generator(device=device).manual_seed(0),
        )
        _sync(device)
        return sum(len(t_) for t_ in s.tokens) / (time.perf_counter() - t)

    train_once(), sample_once(True)  # warm-up
    res = {
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu x{threads} threads",
        "params": model.num_params(),
        "batch_size": batch_size,
        "block_size": a.block_size,
        "repeats": repeats,
        "train_tokens_per_s": _stats([train_once() for _ in range(repeats)]),
        "sample_tokens_per_s_kv_cache": _stats([sample_once(True) for _ in range(repeats)]),
        "sample_tokens_per_s_no_cache": _stats([sample_once(False) for _ in range(repeats)]),
    }
    if device == "cuda":
        n, L, C, T = model.num_params(), cfg.n_layer, cfg.n_embd, cfg.block_size
        flops_per_token = 6 * n + 12 * L * C * T
        name = res["device"]
        peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
        tps = res["train_tokens_per_s"]["median"]
        res["mfu"] = flops_per_token * tps / peak if peak else None
    return res


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench train: {res['params']:,} params on {res['device']}")
    for col in ("measurement", "median tokens/s", "min", "max"):
        t.add_column(col, justify="right" if col != "measurement" else "left")
    for key, label in [
        ("train_tokens_per_s", f"training (batch {res['batch_size']} x {res['block_size']})"),
        ("sample_tokens_per_s_kv_cache", "sampling, KV cache (16 prompts x 8)"),
        ("sample_tokens_per_s_no_cache", "sampling, no cache (16 prompts x 8)"),
    ]:
        s = res[key]
        t.add_row(label, f"{s['median']:,.0f}", f"{s['min']:,.0f}", f"{s['max']:,.0f}")
    if res.get("mfu") is not None:
        t.add_row("MFU (bf16 peak)", f"{res['mfu']:.2%}", "", "")
    Console().print(t)
