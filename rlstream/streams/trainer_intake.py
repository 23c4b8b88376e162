"""The stream trainer's intake: experience rows into complete groups of G, each either ready to
train or dropped untrained for a reason of its own, and counted either way.

A row seen before (a redelivery: the de-duplication window of event ids) is skipped; a row
produced by a policy more than `rl.max_policy_lag` versions old is taken but never trained. A
complete group is dropped when an episode's environment failed (dead-lettered by the
processors; `env.max_failed_groups` in a row stop the run) or, with
`rl.filter_zero_variance`, when every reward in it is the same (it teaches nothing; the
scheduler issues another in its place, up to `rl.filter_max_rounds` batches' worth a step).
`StreamTrainer` holds the state (`seen`, `pending`, `ready`, `counters`, the ledger) and
checkpoints it; this class is how rows enter it.
"""

from __future__ import annotations

from rlstream import metrics as prom
from rlstream.streams.experience_checks import check_environment


class GroupIntake:
    """Mixed into `StreamTrainer` (trainer.py), whose state these methods read and write."""

    def take(self, rows: list[dict]) -> None:
        """Rows of rl.experience.v2 into their groups: a complete group is kept to train
        (`ready`) or dropped here."""
        floor = self.state.version - self.cfg.rl.max_policy_lag
        for row in rows:
            if row in self.seen:
                self.counters["duplicates_skipped"] += 1
                prom.TRAINER_DUPLICATES.inc()
                continue
            if row["policy_version"] >= floor:  # an older row is stale: it is never trained
                self.seen.add(row)
            group = self.pending[row["request_id"]]
            group[row["sample_idx"]] = row
            if len(group) == self.cfg.rl.group_size:
                rows_in_order = [group[i] for i in sorted(group)]
                del self.pending[row["request_id"]]
                errors = [r["env_error"] for r in rows_in_order if r.get("env_error")]
                if errors:
                    self.drop(rows_in_order, "env_failed")  # dead-lettered by the processors
                    self.failed_in_a_row[errors[0].partition(":")[0]] += 1
                    check_environment(self.failed_in_a_row, self.cfg.env.max_failed_groups)
                    continue
                self.failed_in_a_row.clear()
                if self.filtering() and len({r["reward"] for r in rows_in_order}) == 1:
                    self.drop_zero_variance(rows_in_order)
                else:
                    self.ready.append(rows_in_order)

    def filtering(self) -> bool:
        """Whether zero-variance groups are dropped now (on, and under the batch's cap)."""
        rl = self.cfg.rl
        cap = rl.filter_max_rounds * rl.prompts_per_step
        return rl.filter_zero_variance and self.counters["filtered_this_batch"] < cap

    def count_lag(self, group: list[dict]) -> None:
        """Versions behind the trainer when consumed (dropped groups included)."""
        self.counters[f"lag_{self.state.version - group[0]['policy_version']}"] += 1

    def drop_zero_variance(self, group: list[dict]) -> None:
        """A group that teaches nothing, filtered out: consumed (the scheduler refills), counted,
        never trained."""
        self.count_lag(group)
        self.counters["groups_consumed"] += 1
        self.counters["zero_variance_groups"] += 1
        self.counters["filtered_groups"] += 1
        self.counters["filtered_this_batch"] += 1
        self.counters["refill_groups"] += 1
        self.record(group, "filtered")
        prom.TRAINER_GROUPS.inc()
        prom.TRAINER_ZERO_VARIANCE_GROUPS.inc()

    def drop(self, group: list[dict], outcome: str) -> None:
        """A group never trained for a reason of its own (`outcome`): consumed and counted."""
        self.count_lag(group)
        self.counters["groups_consumed"] += 1
        self.counters[f"{outcome}_groups"] += 1
        self.counters["refill_groups"] += 1  # the scheduler issues another in its place
        self.record(group, outcome)
        prom.TRAINER_GROUPS.inc()
