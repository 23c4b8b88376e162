"""The tokenizers' shared text conventions (pad and end-of-sequence texts, the character
alphabet) and what a process can read of a tokenizer without importing torch or transformers."""

from __future__ import annotations

import string
from pathlib import Path

from rlstream.config.modelpath import parse_tokenizer, resolve_path

PAD, EOS = "<pad>", "\n"  # the char tokenizer's pad token and end of a document / completion
BPE_EOS = "<|endoftext|>"  # a trained BPE's end of sequence (a newline still ends a completion)
CHARS = string.printable[:95]  # printable ASCII: every character the built-in tasks write


def vocab_size(model) -> int | None:
    """The vocabulary size of a model config's tokenizer read from its `tokenizer.json` with
    the `tokenizers` library alone (None where there is none to read), so a process that only
    checks token ids (the stream processors) imports neither torch nor transformers."""
    kind, where = resolve_path(model.path)
    if kind == "preset":
        tok_kind, tok_where = parse_tokenizer(model.tokenizer, kind)
        if tok_kind == "char":
            return len(set(CHARS) | {EOS}) + 1  # <pad>, newline, the printable characters
        if tok_kind != "dir":
            return None
        where = tok_where
    path = Path(where) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
