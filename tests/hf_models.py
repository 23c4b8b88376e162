"""Tiny random Hugging Face checkpoints for tests, the way TRL's and verl's tests build them: a
small config, random weights and a real subword (byte-level BPE) tokenizer, written with
`save_pretrained` into a directory a user would pass as `--model DIR`."""

from __future__ import annotations

import random
from pathlib import Path

import torch

EOT = "<|endoftext|>"  # like GPT-2 / Qwen2: the only special token, and no pad token
CHAT = (  # ChatML, as Qwen2's tokenizers carry it
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def arithmetic_text(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        lines += [f"{a:03d}+{b:03d}={a + b:04d}\n", f"{max(a, b):03d}-{min(a, b):03d}="]
    return lines


def tiny_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rust = Tokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    rust.train_from_iterator(arithmetic_text(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=EOT)


def chars_without_newline():
    """A word-level tokenizer of single printable characters, as users build for character
    models, whose vocabulary has no newline; `</s>` ends a sequence."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", *string.printable[:95]])}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    rust.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    rust.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=rust, eos_token="</s>", unk_token="<unk>")


def tiny_model_dir(
    directory: Path,
    arch: str = "qwen2",
    seed: int = 0,
    chat_template: str | None = None,
    tokenizer: str = "bpe",
    positions: int = 64,
) -> Path:
    """A random `arch` (llama or qwen2) causal LM of about 0.1 M parameters and its tokenizer
    (`bpe`, or `chars`: single characters without a newline), with `chat_template` if given,
    saved as a Hugging Face directory."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = tiny_tokenizer() if tokenizer == "bpe" else chars_without_newline()
    tok.chat_template = chat_template
    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = kind(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=positions,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(Path(directory) / "model.safetensors")
