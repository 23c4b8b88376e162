"""The policy model: a Hugging Face `transformers` causal LM, its tokenizer, and from-scratch
presets.

    tok = load_tokenizer(cfg.model)            # a user's tokenizer, or a preset's
    model = build_model(cfg.model, tok, ...)   # AutoModelForCausalLM (+ a value head for PPO)
    logits = model(idx)                        # (B, T, V); model(idx, values=True) adds (B, T)

`model.path` is a local Hugging Face directory (config, safetensors weights, tokenizer files) or
`preset:NAME`, a from-scratch config built with `AutoModelForCausalLM.from_config`. Nothing is
downloaded: a hub id is refused with the command that fetches it. The default preset is a
GPT-2-architecture model sized like the hand-written GPT it replaced (4 layers x 128, 0.81 M
parameters), with a character-level tokenizer (or a byte-level BPE trained on the run's
corpus, `model.tokenizer=bpe:N`) saved as a standard tokenizer directory; a
Llama-architecture one of the same size (`tiny-llama`) learns the built-in arithmetic less well
at the default budget.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from rlstream.config.modelpath import PRESET_NAMES, parse_lora, parse_tokenizer, resolve_path
from rlstream.trainers.tokens import BPE_EOS, CHARS, EOS, PAD


class Tokenizer:
    """A Hugging Face tokenizer with what the loops need: ids without special tokens added,
    pad and end-of-sequence ids, and which tokens end a completion.

    >>> tok = Tokenizer.char()
    >>> tok.decode(tok.encode("037+085=2210\\n"))
    '037+085=2210\\n'
    """

    def __init__(self, hf):
        self.hf = hf
        if hf.eos_token_id is None:
            raise ValueError("the tokenizer has no end-of-sequence token (eos_token)")
        self.eos_id: int = hf.eos_token_id
        # no pad token (most causal LMs): pad with EOS; padding is masked everywhere it matters
        self.pad_id: int = hf.pad_token_id if hf.pad_token_id is not None else self.eos_id
        self.vocab = hf.get_vocab()
        # one token per character, each standing for itself (a byte-level BPE's byte tokens
        # are single characters too, but stand for bytes: "Ċ" is a newline)
        self.is_char = all(
            len(t) == 1 and hf.convert_tokens_to_string([t]) == t
            for t in self.vocab
            if t not in hf.all_special_tokens
        )
        self.chat = False  # prompts go through the tokenizer's chat template (load_tokenizer)
        self._texts: list[str] | None = None  # each token's text, for stop_ids
        self._stops: dict[tuple[str, ...], frozenset[int]] = {}

    @classmethod
    def char(cls, alphabet: str = CHARS) -> Tokenizer:
        """One token per character: <pad> 0, newline 1 (end of sequence), then `alphabet`."""
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast

        chars = [EOS] + [c for c in dict.fromkeys(alphabet) if c != EOS]
        vocab = {PAD: 0} | {c: i + 1 for i, c in enumerate(chars)}
        rust = RustTokenizer(models.WordLevel(vocab, unk_token=None))
        rust.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        rust.decoder = decoders.Fuse()
        hf = PreTrainedTokenizerFast(
            tokenizer_object=rust, pad_token=PAD, eos_token=EOS, clean_up_tokenization_spaces=False
        )
        return cls(hf)

    @classmethod
    def bpe(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """A byte-level BPE of `vocab_size` tokens trained on `texts`: <pad> 0, <|endoftext|> 1,
        the 256 bytes, then merges. GPT-2's pre-split keeps merges inside words, numbers and
        runs of punctuation, and digits stay one token each (as Llama's and Qwen's do), so a
        number's tokens do not depend on its neighbours. Any text encodes: nothing is unknown."""
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        rust = RustTokenizer(models.BPE())
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        rust.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
        rust.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[PAD, BPE_EOS], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )  # fmt: skip
        rust.train_from_iterator(texts, trainer)
        hf = PreTrainedTokenizerFast(
            tokenizer_object=rust, pad_token=PAD, eos_token=BPE_EOS,
            clean_up_tokenization_spaces=False,
        )  # fmt: skip
        return cls(hf)

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(directory)))

    def save(self, directory: str | Path) -> None:
        self.hf.save_pretrained(str(directory))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos(self) -> str:
        return self.hf.eos_token

    def unknown(self, text: str) -> list[str]:
        """Characters of `text` a char tokenizer has no token for (none for subword ones)."""
        if not self.is_char:
            return []
        return sorted({c for c in text if c not in self.vocab})

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            raise ValueError(f"character {missing[0]!r} is not in the tokenizer's alphabet")
        return self.hf.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        for text in texts:
            if self.unknown(text):
                self.encode(text)  # raises, naming the character
        if not texts:
            return []
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None and backend.padding is None:
            # the Rust tokenizer itself: the same ids as the call below without transformers'
            # per-text conversion (half the time of a 100k-document corpus)
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return self.hf(texts, add_special_tokens=False)["input_ids"]

    def encode_documents(self, docs: list[str]) -> list[list[int]]:
        """Pre-training documents, each ending in EOS (a newline). A tokenizer that cannot
        write a newline (a user's character vocabulary without one) ends each with its own
        end-of-sequence token instead, rather than refusing every document."""
        if not self.unknown(EOS) or self.eos_id is None:
            return self.encode_batch(docs)
        bodies = self.encode_batch([d.removesuffix(EOS) for d in docs])
        return [ids + [self.eos_id] * d.endswith(EOS) for ids, d in zip(bodies, docs, strict=True)]

    def format_prompt(self, text: str) -> str:
        """The text the model sees for a prompt: as it is, or one user turn of the chat
        template with the generation prompt (the assistant's turn) opened, as TRL and verl do."""
        if not self.chat:
            return text
        turn = [{"role": "user", "content": text}]
        return self.hf.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)

    def format_turn(self, text: str, after_eos: bool = False) -> str:
        """The text an environment's answer becomes between two policy turns: as it is, or
        with the chat template, the assistant's turn closed, the answer as a user turn and the
        next assistant turn opened, in the template's own markers (its end marker left out
        when the policy's turn already ended with the end-of-sequence token)."""
        if not self.chat:
            return text
        mark = "\x00rlstream-turn\x00"
        turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": mark},
                 {"role": "user", "content": text}]  # fmt: skip
        shown = self.hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        between = shown[shown.index(mark) + len(mark) :]
        eos = self.hf.eos_token or ""
        return between.removeprefix(eos) if after_eos and eos else between

    def encode_prompts(self, texts: list[str]) -> list[list[int]]:
        return self.encode_batch([self.format_prompt(t) for t in texts])

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` without padding (an EOS that is a character, like newline, stays)."""
        keep = [i for i in ids if i != self.pad_id] if self.pad_id != self.eos_id else ids
        return self.hf.decode(keep, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def stop_ids(self, stop: tuple[str, ...]) -> frozenset[int]:
        """EOS and every token whose text holds one of `stop` (a subword vocabulary merges a
        newline into many tokens; a char one has exactly one per stop character)."""
        key = tuple(stop)
        if key not in self._stops:
            if self._texts is None:
                ids = [[i] for i in range(len(self.hf))]
                self._texts = self.hf.batch_decode(ids, clean_up_tokenization_spaces=False)
            hits = [i for i, t in enumerate(self._texts) if any(s in t for s in key)]
            self._stops[key] = frozenset([self.eos_id, *hits])
        return self._stops[key]


class CausalLM(nn.Module):
    """A transformers causal LM (`lm`) with an optional scalar value head on its last hidden
    state (PPO's critic), and the context length the loops may use (`block_size`)."""

    def __init__(self, lm, block_size: int, value_head: bool = False):
        super().__init__()
        self.lm = lm
        self.block_size = block_size
        self.value_head = None
        if value_head:
            self.add_value_head()

    def add_value_head(self) -> None:
        """A fresh scalar head on the last hidden state (PPO's critic; a policy version has
        none: it is the trainer's)."""
        hidden = self.lm.config.get_text_config().hidden_size
        device = next(self.lm.parameters()).device
        self.value_head = nn.Linear(hidden, 1).to(device)

    def num_params(self, trainable: bool = False) -> int:
        return sum(p.numel() for p in self.lm.parameters() if p.requires_grad or not trainable)

    def forward(self, idx, attention_mask=None, position_ids=None, cache=None, values=False):
        """Logits (B, T, V) for tokens idx (B, T); plus values (B, T) when values=True.

        attention_mask (B, Tk): 1 for real tokens, 0 for (left) padding; position_ids (B, T);
        cache: a transformers Cache, extended in place (sampling).
        """
        out = self.lm(
            input_ids=idx,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            output_hidden_states=values,
        )
        if not values:
            return out.logits
        if self.value_head is None:
            raise ValueError("this model has no value head (rl.algo ppo builds one)")
        return out.logits, self.value_head(out.hidden_states[-1]).squeeze(-1)


# --- presets ----------------------------------------------------------------------------------
PRESETS: dict[str, Callable] = {}


def preset(name: str):
    def register(fn):
        PRESETS[name] = fn
        return fn

    return register


@preset("tiny")
def _tiny(m, tok: Tokenizer):
    """GPT-2 architecture (learned positions, GELU MLP, LayerNorm) sized by model.n_layer /
    n_head / n_embd (default 4 x 4 x 128: 0.81 M parameters)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=tok.vocab_size, n_embd=m.n_embd, n_layer=m.n_layer, n_head=m.n_head,
        n_positions=m.block_size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=True, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id,
        bos_token_id=tok.eos_id,
    )  # fmt: skip


@preset("tiny-llama")
def _tiny_llama(m, tok: Tokenizer):
    """Llama architecture (RoPE, SwiGLU, RMSNorm) sized like `tiny`: at the default budget it
    learns the built-in arithmetic less well (77.7% held-out after RL vs 94.1%; CHANGELOG)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=m.n_embd, intermediate_size=_swiglu_width(m.n_embd),
        num_hidden_layers=m.n_layer, num_attention_heads=m.n_head, num_key_value_heads=m.n_head,
        max_position_embeddings=m.block_size, tie_word_embeddings=True,
        pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=None,
    )  # fmt: skip


def _swiglu_width(n_embd: int) -> int:
    """8/3 of the width, a multiple of 8: a SwiGLU MLP with a GELU MLP's (4x) parameters."""
    return -(-8 * n_embd // 3 // 8) * 8


@preset("qwen2-0.5b")
def _qwen2_half_billion(m, tok: Tokenizer):
    """The Qwen2-0.5B shape (24 layers x 896, 14 heads, 2 KV heads) for GPU throughput work."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=tok.vocab_size, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=max(
            m.block_size, 32
        ), tie_word_embeddings=True, rope_theta=1_000_000.0,
        pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=None,
    )  # fmt: skip


def with_lora(lm, spec: str):
    """`lm` with trainable LoRA adapters (peft); its own weights frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(lm, LoraConfig(task_type="CAUSAL_LM", **parse_lora(spec)))


def merged(lm):
    """A plain transformers model: a copy of `lm` with its LoRA adapters merged in (or `lm`)."""
    import copy

    from peft import PeftModel

    return copy.deepcopy(lm).merge_and_unload() if isinstance(lm, PeftModel) else lm


def load_tokenizer(m) -> Tokenizer:
    """The run's tokenizer: the model directory's own, or a preset's (model.tokenizer: the
    char-level one, or a directory); prompts use its chat template when it has one and
    model.chat_template is auto. A bpe:N not trained yet (`datasets.with_tokenizer`) is an error."""
    kind, where = resolve_path(m.path)
    if kind == "dir":
        tok = Tokenizer.load(where)
    else:
        tok_kind, tok_where = parse_tokenizer(m.tokenizer, kind)
        if tok_kind == "bpe":
            raise ValueError(
                f"model.tokenizer: {m.tokenizer} is trained on the run's data before the run "
                "starts (datasets.with_tokenizer names its directory)"
            )
        tok = Tokenizer.char() if tok_kind == "char" else Tokenizer.load(tok_where)
    tok.chat = m.chat_template == "auto" and bool(getattr(tok.hf, "chat_template", None))
    return tok


def prepare_transformers() -> None:
    """Call before importing transformers' model classes. No progress bar per load or save (a
    policy version is loaded every RL step), and no scikit-learn: `transformers.generation`
    imports it (and scipy) when installed, for assisted decoding's confidence threshold only,
    which rlstream does not use; that import was a third of a rollout worker's start (1.1 s of
    CPU of 3.8 for the model classes), paid again by every restarted process. Nor
    scipy.optimize, which `modeling_utils` imports for the object-detection losses only: 21 MiB
    of private memory in each of the loop's four torch processes."""
    import transformers.utils
    from transformers.utils import logging as hf_logging

    if "transformers.generation.candidate_generator" not in sys.modules:
        transformers.utils.is_sklearn_available = lambda: False
    if "transformers.loss.loss_utils" not in sys.modules:
        transformers.utils.is_scipy_available = lambda: False
    hf_logging.disable_progress_bar()


def build_model(m, tok: Tokenizer, value_head: bool = False, device: str = "cpu") -> CausalLM:
    """A preset initialised from the current torch seed, or a directory's weights."""
    prepare_transformers()
    from transformers import AutoModelForCausalLM

    kind, where = resolve_path(m.path)
    if kind == "preset":
        lm = AutoModelForCausalLM.from_config(PRESETS[where](m, tok), dtype=torch.float32)
        block = m.block_size
    else:
        lm = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
        block = min(m.block_size, lm.config.get_text_config().max_position_embeddings)
        if m.lora is not None:
            lm = with_lora(lm, m.lora)
    lm.generation_config.pad_token_id = tok.pad_id
    return CausalLM(lm, block, value_head).to(device)


assert set(PRESETS) == set(PRESET_NAMES), "modelpath.PRESET_NAMES lists every preset"


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1)
