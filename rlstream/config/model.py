"""What is trained on what: the model (`model.*`) and the data (`data.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlstream.config.checks import ConfigError, at_least, choice
from rlstream.registry import SETTING_CHECKS


@dataclass
class ModelConfig:
    path: str = "preset:tiny"
    """a local Hugging Face model directory, or preset:NAME (from scratch: tiny, qwen2-0.5b)"""
    n_layer: int = 4
    """transformer layers (the tiny preset)"""
    n_head: int = 4
    """attention heads (the tiny preset)"""
    n_embd: int = 128
    """embedding width (the tiny preset)"""
    block_size: int = 32
    """context length (prompt + completion)"""
    tokenizer: str = "char"
    """a preset's tokenizer: char (one token per printable ASCII character), bpe:N (a byte-level
    BPE of N tokens trained on the run's corpus and train prompts, saved with the model; the run
    names its directory here), or a tokenizer directory. A model directory brings its own"""
    chat_template: str = "auto"
    """auto: prompts go through the tokenizer's chat template when it has one; off: raw text"""
    lora: str | None = None
    """LoRA adapters on a model directory (peft), e.g. r=16,alpha=32[,dropout=0.05]; none: full
    fine-tuning. Policy versions and exports are merged weights"""
    device: str = "auto"
    """cpu, cuda or auto (cuda when available)"""
    backend: str = "auto"
    """optimisation backend: torch, deepspeed, or auto (deepspeed on CUDA when installed)"""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage"""
    threads: int | None = None
    """torch CPU threads per process (default: 2 in-process, 1 per streaming process)"""

    def __post_init__(self):
        from rlstream.config.modelpath import (
            ModelPathError,
            parse_lora,
            parse_tokenizer,
            resolve_path,
        )

        try:
            kind, _ = resolve_path(self.path)
            parse_tokenizer(self.tokenizer, kind)
            if self.lora is not None:
                parse_lora(self.lora)
                if kind == "preset":
                    raise ModelPathError(
                        "model.lora: LoRA adapts a trained checkpoint; a preset starts from "
                        "random weights (give --model DIR)"
                    )
        except ModelPathError as exc:
            raise ConfigError(str(exc)) from None
        choice("model", "chat_template", self.chat_template, ("auto", "off"))
        choice("model", "device", self.device, ("auto", "cpu", "cuda"))
        choice("model", "backend", self.backend, ("auto", "torch", "deepspeed"))
        choice("model", "zero_stage", self.zero_stage, (0, 1, 2, 3))
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            at_least("model", name, getattr(self, name), 1)
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd ({self.n_embd}) must be a multiple of model.n_head")


@dataclass
class DataConfig:
    tasks: str = "add,sub"
    """task mix: name[:weight][@dmin-dmax], comma separated (add sub mul chain countdown word
    rg:<reasoning-gym dataset>)"""
    pool_size: int = 20_000
    """train prompts in the selection pool"""
    corpus_docs: int = 100_000
    """pre-training documents (worked solutions from the train split)"""
    flaw_rate: float = 0.65
    """share of flawable documents written with their family's systematic mistake"""
    format: str = "direct"
    """how the generated prompts are answered: direct (the answer alone) or cot (a worked
    solution, then the final answer in <answer>...</answer>, which alone is verified; unless
    given, model.block_size is then 96 and rl.max_new_tokens 64: FORMAT_DEFAULTS)"""
    prompts: str | None = None
    """the run's prompts: a JSONL/CSV/Parquet file (published to rl.prompts.v1 first) or
    topic:DATASET (already there, from any producer); unset: generated from data.tasks"""
    corpus: str | None = None
    """pre-training documents: a file or topic:DATASET like data.prompts; unset: the generated
    corpus, or (with data.prompts) the train prompts written out with their answers"""
    dataset: str | None = None
    """the dataset name the run's prompts and documents carry; unset: from data.prompts (a
    file's stem, topic:NAME's NAME), or generated-<run_id>"""
    heldout_frac: float = 0.2
    """share of a user dataset's prompts held out for evaluation when its rows carry no split
    (chosen by prompt_id, so the same prompts in every run)"""

    def __post_init__(self):
        at_least("data", "pool_size", self.pool_size, 1)
        at_least("data", "corpus_docs", self.corpus_docs, 1)
        if not 0 <= self.flaw_rate <= 1:
            raise ConfigError(f"data.flaw_rate: {self.flaw_rate!r} must be in [0, 1]")
        if not 0 < self.heldout_frac < 1:
            raise ConfigError(f"data.heldout_frac: {self.heldout_frac!r} must be in (0, 1)")
        choice("data", "format", self.format, ("direct", "cot"))
        try:  # the task families own what a mix may name (rlstream.registry.SETTING_CHECKS)
            SETTING_CHECKS.lookup("data.tasks")(self.tasks, self.format)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("prompts", "corpus"):
            source = getattr(self, name)
            if source is None or source.startswith("topic:"):
                if source == "topic:":
                    raise ConfigError(f"data.{name}: give the dataset, topic:NAME")
                continue
            if not Path(source).is_file():
                raise ConfigError(
                    f"data.{name}: no such file {source!r}; give a JSONL, CSV or Parquet file "
                    "or topic:DATASET"
                )
            if Path(source).suffix.lower() not in (".jsonl", ".ndjson", ".json", ".csv",
                                                    ".parquet", ".pq"):  # fmt: skip
                raise ConfigError(f"data.{name}: {source!r} is not .jsonl, .csv or .parquet")
