"""What the stream trainer checks before and after training a group: rows it cannot train on
(dead-lettered with the reason), the window of event ids that keeps a redelivered group from
being trained twice, the ledger of groups trained, and when an eval or checkpoint is due.

The trainer's ledger says what became of every group it consumed: trained (at which step),
dropped as stale, filtered (zero variance), or taken but not trained when the run ended. Each
checkpoint writes the entries since the previous one as `<run>/trainer/ledger/upto-NNNNNN.parquet`
just before the checkpoint itself: a trainer killed in between resumes from the previous
checkpoint, retrains the same steps and overwrites that part, so the ledger is exactly what the
checkpointed model learned from (`rlstream chaos` audits a run against it)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pyarrow as pa

from rlstream.schemas import DecodeError
from rlstream.trainers.experience import RowLimits, row_problem

LEDGER_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("outcome", pa.string()), ("rl_step", pa.int64()),
    ("policy_version", pa.int64()), ("event_ids", pa.list_(pa.string())),
])  # fmt: skip


class EnvironmentBroken(RuntimeError):
    """env.max_failed_groups groups in a row had an episode whose environment failed."""


def check_environment(failed_in_a_row: Counter, limit: int) -> None:
    """Raise EnvironmentBroken once `limit` groups in a row failed (0: never); the counter
    holds the error kinds since the last good group."""
    failed = sum(failed_in_a_row.values())
    if limit and failed >= limit:
        kinds = ", ".join(f"{k} {n}" for k, n in failed_in_a_row.most_common())
        raise EnvironmentBroken(
            f"{failed} groups in a row had an episode whose environment failed ({kinds}); "
            "the dead letters on rl.dead_letters.v1 say why. Fix the environment, or raise "
            "env.max_failed_groups (0: never stop)"
        )


def ledger_prefix(run_id: str) -> str:
    return f"{run_id}/trainer/ledger/"


def ledger_entry(group: list[dict], outcome: str, rl_step: int) -> dict:
    return {
        "request_id": group[0]["request_id"],
        "outcome": outcome,
        "rl_step": rl_step,
        "policy_version": group[0]["policy_version"],
        "event_ids": [r["event_id"] for r in group],
    }


def write_ledger(store, run_id: str, rl_step: int, entries: list[dict]) -> None:
    """The entries since the previous checkpoint, as the part that ends at `rl_step`."""
    name = f"{ledger_prefix(run_id)}upto-{rl_step:06d}.parquet"
    store.put_parquet(name, pa.Table.from_pylist(entries, LEDGER_SCHEMA))


class UntrainableRow(DecodeError):
    """An experience row that decodes but cannot be trained on: taken, it would put NaN into
    the weights or crash the trainer on every restart (a poison pill)."""

    kind = "untrainable_row"


def untrainable(row: dict, vocab_size: int, block_size: int, group_size: int) -> str | None:
    """Why this experience row cannot be trained on, or None (pure: the trainer dead-letters
    the row with this reason)."""
    return row_problem(row, RowLimits(vocab_size, block_size, group_size))


class VersionWindow:
    """Event ids by the policy version that produced them, kept only while trainable.

    The trainer trains a row only while `version - row.policy_version <= max_policy_lag`, and its
    version only grows: once a version falls below that floor, none of its rows can ever be
    trained again, whether seen before or not, so their ids can be forgotten (`forget_before`).
    A copy redelivered later is dropped as stale by its version alone (counted as stale, not as a
    duplicate). The set stays about `(max_policy_lag + 1) x rows per version` ids however long
    the run. An event id has one version: copies are byte-identical (the assembler keeps the
    first copy of a group).
    """

    def __init__(self) -> None:
        self.by_version: dict[int, set[str]] = defaultdict(set)

    def __contains__(self, row: dict) -> bool:
        return row["event_id"] in self.by_version.get(row["policy_version"], ())

    def add(self, row: dict) -> None:
        self.by_version[row["policy_version"]].add(row["event_id"])

    def forget_before(self, floor: int) -> None:
        for version in [v for v in self.by_version if v < floor]:
            del self.by_version[version]

    def __len__(self) -> int:
        return sum(len(ids) for ids in self.by_version.values())

    def state_dict(self) -> dict[str, list[str]]:
        return {str(v): sorted(ids) for v, ids in self.by_version.items()}

    def load_state_dict(self, state, version: int) -> None:
        """`state` as saved; a checkpoint from before the window (a flat id list) is kept at
        `version`, so it lasts as long as anything it could de-duplicate."""
        if isinstance(state, list):
            state = {str(version): state}
        self.by_version = defaultdict(set, {int(v): set(ids) for v, ids in state.items()})


def due(step: int, before: int, every: int, last: int) -> bool:
    """Whether an eval or a checkpoint every `every` steps is due after an update that moved the
    RL step from `before` to `step`. Never when it did not move (every group of the batch was
    stale): a second checkpoint at a step wrote that step's ledger part again, with only the
    stale groups, and the groups trained since the checkpoint before went out of the ledger."""
    return step > before and (step % every == 0 or step == last)
