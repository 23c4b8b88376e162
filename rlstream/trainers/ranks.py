"""Data-parallel trainer ranks over torch.distributed (gloo on CPU, NCCL on GPU).

Rank 0 is the trainer the loop always had: it alone reads experience and the corpus,
evaluates, checkpoints and publishes policy versions. At each update it shares the batch out
(`Ranks.lead`): whole groups round-robin for RL (group-relative advantages stay exact), rows
for pre-training, one shard a rank, so every row is trained by exactly one rank. Ranks 1..N-1
(`trainers/core.follow`) run the same update on their shard. Gradients are summed across the
ranks weighted by each shard's share of the batch (response tokens for RL, rows for
pre-training), so the step is the one the whole batch would have given, and every rank applies
it: the weights stay identical without ever being sent again. Rank 0 sends its whole train
state when the group starts (`sync`), so a restarted group resumes from rank 0's last
checkpoint together. The batch goes to every rank whole (a broadcast; fine at this scale, a
scatter for large batches).

A rank that dies breaks the others' collectives; they exit and the supervisor restarts the
group (`ops/launcher/supervisor.py`). Rank and world come from RLSTREAM_TRAINER_RANK (or
`--rank`) and RLSTREAM_TRAINER_WORLD; the rendezvous is RLSTREAM_TRAINER_PORT on
RLSTREAM_TRAINER_HOST (rank 0's; loopback by default), or RLSTREAM_TRAINER_INIT.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

RANK_ENV, WORLD_ENV, PORT_ENV, HOST_ENV, INIT_ENV = (
    "RLSTREAM_TRAINER_RANK",
    "RLSTREAM_TRAINER_WORLD",
    "RLSTREAM_TRAINER_PORT",
    "RLSTREAM_TRAINER_HOST",
    "RLSTREAM_TRAINER_INIT",  # a whole init_method instead (file:///shared/path: no port)
)
LOCAL_ENV = "RLSTREAM_TRAINER_LOCAL_RANK"  # the GPU index on this machine (a pod's own GPUs)
TIMEOUT = datetime.timedelta(minutes=30)  # rank 0 may wait this long for experience


@dataclass
class Ranks:
    rank: int
    world: int

    @classmethod
    def from_env(cls, rank: int | None = None, world: int = 1) -> Ranks | None:
        """The process group this process belongs to (joined here), or None for one rank.
        `world` is the run's `loop.trainer_ranks`; RLSTREAM_TRAINER_WORLD overrides it."""
        world = int(os.environ.get(WORLD_ENV, world))
        if world <= 1:
            return None
        rank = int(os.environ.get(RANK_ENV, "0")) if rank is None else rank
        host = os.environ.get(HOST_ENV, "127.0.0.1")
        if not os.environ.get(INIT_ENV) and not os.environ.get(PORT_ENV):
            raise SystemExit(f"trainer rank {rank} of {world}: set {PORT_ENV} (rank 0's "
                             f"rendezvous port, on {HOST_ENV}) or {INIT_ENV}")  # fmt: skip
        init = os.environ.get(INIT_ENV) or f"tcp://{host}:{os.environ[PORT_ENV]}"
        # what DeepSpeed reads: the same on every rank of this group and no other (its CPU
        # shared-memory reduce names its segments after the master's address and port)
        port = os.environ.get(PORT_ENV) or str(20000 + zlib.crc32(init.encode()) % 40000)
        local = local_rank(rank)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(rank),
                          LOCAL_RANK=str(local), WORLD_SIZE=str(world))  # fmt: skip
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)  # before any tensor: NCCL and the model use this GPU
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=TIMEOUT)  # fmt: skip
        log.info("rank %d of %d joined (%s)", rank, world, backend)
        return cls(rank, world)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def send(self, command: tuple) -> None:
        """Rank 0: one command to every follower (a pickled object)."""
        dist.broadcast_object_list([command], src=0)

    def receive(self) -> tuple:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: object) -> list | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        out = [None] * self.world if self.leader else None
        dist.gather_object(obj, out, dst=0)
        return out

    def lead(self, kind: str, lr: float, shards: list, *extra) -> object:
        """Rank 0: send every rank its shard of this update; return rank 0's own."""
        self.send((kind, lr, shards, *extra))
        return shards[0]

    def reduce_gradients(self, params: list[torch.nn.Parameter], weight: float) -> None:
        """Every rank's gradients, weighted by its share of the batch, summed in place: each
        gradient becomes sum_r(w_r * g_r) / sum_r(w_r). A rank with an empty shard gives
        weight 0 (its gradients count as zeros)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) * weight for g in grads] +
                         [torch.tensor([float(weight)], device=grads[0].device)])  # fmt: skip
        dist.all_reduce(flat)
        total = float(flat[-1])
        flat = flat[:-1] / max(total, 1e-12)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def reduce_metrics(self, metrics: dict, keys: list[str], weight: float) -> dict:
        """The update's figures over the whole batch: a weighted mean of each key in `keys`
        (sums for `tokens`), the same keys on every rank."""
        values = [float(metrics.get(k, 0.0)) * (1.0 if k == "tokens" else weight) for k in keys]
        t = torch.tensor([*values, float(weight)], dtype=torch.float64, device=_collective())
        dist.all_reduce(t)
        total = max(float(t[-1]), 1e-12)
        reduced = {
            k: float(v) / (1.0 if k == "tokens" else total)
            for k, v in zip(keys, t[:-1], strict=True)
        }
        return metrics | reduced | {"tokens": int(reduced.get("tokens", 0))}

    def close(self) -> None:
        """Every rank together: past its last collective, then its process group torn down
        while the interpreter is whole. Leaving the pending work objects (DeepSpeed's among
        them) to the interpreter's exit aborted a rank now and then (`terminate called without
        an active exception`, SIGABRT after its work was saved; 1 in 6 runs of the ZeRO
        checkpoint test here)."""
        if dist.is_initialized():
            dist.barrier()
            gc.collect()
            dist.destroy_process_group()


def _collective() -> str:
    """Where a collective's own tensors live: NCCL reduces only GPU tensors."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def local_rank(rank: int) -> int:
    """This rank's GPU on its machine: LOCAL_RANK where a launcher set it (torchrun, a pod
    with several GPUs), else the rank itself (every rank on one machine, the supervisor's
    layout), modulo the GPUs there are; 0 on CPU."""
    gpus = torch.cuda.device_count()
    local = int(os.environ.get(LOCAL_ENV, rank))
    return local % gpus if gpus else local


def share_rows(rows: int, world: int) -> list[slice]:
    """Pre-training: the batch's rows as `world` contiguous shards (sizes differ by 1 at most)."""
    bounds = [rows * r // world for r in range(world + 1)]
    return [slice(bounds[r], bounds[r + 1]) for r in range(world)]


def share_groups(group_ids: list[str], world: int) -> list[list[int]]:
    """RL: row indices per rank, whole groups dealt round-robin in the batch's order."""
    order = list(dict.fromkeys(group_ids))
    rank_of = {g: i % world for i, g in enumerate(order)}
    shards: list[list[int]] = [[] for _ in range(world)]
    for i, g in enumerate(group_ids):
        shards[rank_of[g]].append(i)
    return shards
