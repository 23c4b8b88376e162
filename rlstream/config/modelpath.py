"""What `model.path` and `model.lora` name, checked without importing torch or transformers
(every process validates its config; only some load a model)."""

from __future__ import annotations

from pathlib import Path

PRESET_NAMES = ("tiny", "tiny-llama", "qwen2-0.5b")  # lm.PRESETS builds them


class ModelPathError(ValueError):
    pass


def resolve_path(path: str) -> tuple[str, str]:
    """("preset", NAME) or ("dir", DIR); a ModelPathError names the fix otherwise."""
    if path.startswith("preset:"):
        name = path.removeprefix("preset:")
        if name not in PRESET_NAMES:
            raise ModelPathError(
                f"model.path: unknown preset {name!r}; known: {', '.join(PRESET_NAMES)}"
            )
        return "preset", name
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return "dir", str(p)
    if p.exists():
        raise ModelPathError(
            f"model.path: {path} has no config.json (a Hugging Face model directory: config, "
            "safetensors weights, tokenizer files)"
        )
    if path.count("/") == 1 and not path.startswith((".", "/", "~")):
        raise ModelPathError(
            f"model.path: {path!r} looks like a hub id; rlstream downloads nothing at run time. "
            f"Fetch it first (`hf download {path} --local-dir DIR`), then --model DIR"
        )
    raise ModelPathError(f"model.path: {path} does not exist (a model directory or preset:NAME)")


BPE_SIZES = (260, 65_536)  # a byte-level BPE has 256 byte tokens and two special ones


def parse_tokenizer(spec: str, model_kind: str) -> tuple[str, int | str | None]:
    """What model.tokenizer names: ("char", None), ("bpe", N) or ("dir", DIR); a
    ModelPathError names the fix otherwise."""
    if model_kind != "preset" and spec != "char":
        raise ModelPathError(
            f"model.tokenizer: {spec!r}: a model directory brings its own tokenizer "
            "(model.tokenizer chooses a preset's)"
        )
    if spec == "char":
        return "char", None
    if spec.startswith("bpe:"):
        low, high = BPE_SIZES
        try:
            size = int(spec.removeprefix("bpe:"))
        except ValueError:
            size = 0
        if not low <= size <= high:
            raise ModelPathError(
                f"model.tokenizer: {spec!r}: give bpe:N, the vocabulary size, {low} <= N <= {high}"
            )
        return "bpe", size
    p = Path(spec).expanduser()
    if (p / "tokenizer_config.json").is_file():
        return "dir", str(p)
    raise ModelPathError(
        f"model.tokenizer: {spec!r} is not char, bpe:N or a tokenizer directory "
        "(tokenizer_config.json, what save_pretrained writes)"
    )


LORA_KEYS = {"r": int, "alpha": float, "dropout": float}


def parse_lora(spec: str) -> dict:
    """peft LoraConfig arguments from "r=16,alpha=32[,dropout=0.05]" (ModelPathError names the
    fix); adapters go on every linear layer but the output head, as TRL's defaults do."""
    args = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in LORA_KEYS:
            raise ModelPathError(f"model.lora: {part!r}: give r=N,alpha=X[,dropout=P]")
        try:
            args[key] = LORA_KEYS[key](value)
        except ValueError:
            raise ModelPathError(f"model.lora: {key}={value!r} is not a number") from None
    if args.get("r", 0) < 1:
        raise ModelPathError("model.lora: r (the adapters' rank) must be at least 1, e.g. r=16")
    return {"r": args["r"], "lora_alpha": args.get("alpha", 2.0 * args["r"]),
            "lora_dropout": args.get("dropout", 0.0), "target_modules": "all-linear"}  # fmt: skip
