"""What the stream trainer checks before and after training a group: rows it cannot train on
(dead-lettered with the reason), the window of event ids that keeps a redelivered group from
being trained twice, the ledger of groups trained, and when an eval or checkpoint is due."""

from __future__ import annotations

from collections import defaultdict

from rlstream.schemas import DecodeError
from rlstream.trainers.experience import RowLimits, row_problem


def ledger_prefix(run_id: str) -> str:
    return f"{run_id}/trainer/ledger/"


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
