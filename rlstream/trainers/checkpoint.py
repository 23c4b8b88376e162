"""Checkpoints as bytes through a tiny store interface (a directory here; the object store later).

A checkpoint holds everything needed to continue bit-for-bit on CPU: model, optimizer, schedule,
learner and sampler state, every RNG state, the step and the loop's history. Names are
`step-<n>.pt`, zero-padded so they sort; `keep_last` old checkpoints are retained.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class CheckpointStore(Protocol):
    def save_bytes(self, name: str, data: bytes) -> None: ...
    def load_bytes(self, name: str) -> bytes: ...
    def list(self) -> list[str]: ...
    def delete(self, name: str) -> None:
        """Optional: only needed for the keep_last retention policy."""
        ...


class DirectoryStore:
    """Files in one directory, written atomically (tmp file + rename)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def save_bytes(self, name: str, data: bytes) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.path / name)

    def load_bytes(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def list(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)


class MemoryStore:
    """A dict of bytes (tests, or a staging area before an upload)."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}

    def save_bytes(self, name: str, data: bytes) -> None:
        self.blobs[name] = bytes(data)

    def load_bytes(self, name: str) -> bytes:
        return self.blobs[name]

    def list(self) -> list[str]:
        return sorted(self.blobs)

    def delete(self, name: str) -> None:
        self.blobs.pop(name, None)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])


def to_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def save_checkpoint(store: CheckpointStore, step: int, state: dict, keep_last: int = 3) -> int:
    """Write state (plus global RNG states) as step-<n>.pt; delete all but the newest keep_last.
    Returns the checkpoint's size in bytes."""
    name = checkpoint_name(step)
    data = to_bytes(state | {"rng": rng_state(), "step": step})
    store.save_bytes(name, data)
    ckpts = [n for n in store.list() if n.startswith("step-") and n.endswith(".pt")]
    if hasattr(store, "delete"):  # retention needs delete; a store without it keeps everything
        for old in ckpts[:-keep_last] if keep_last > 0 else []:
            store.delete(old)
    return len(data)


def latest_checkpoint(store: CheckpointStore) -> dict | None:
    """The newest checkpoint's state (global RNG states restored by the caller), or None."""
    ckpts = [n for n in store.list() if n.startswith("step-") and n.endswith(".pt")]
    return from_bytes(store.load_bytes(ckpts[-1])) if ckpts else None
