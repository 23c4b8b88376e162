"""The run report leads with the comparison a reader wants: accuracy before and after RL."""

from __future__ import annotations

from rlstream.ops.launcher.report import accuracy_by_task, headline, write_report
from rlstream.ops.launcher.watch import RunView


def _evals() -> list[dict]:
    rows = []
    for step, acc in ((0, {"all": 0.4, "add": 0.5, "sub": 0.3}), (8, {"all": 0.9, "add": 1.0})):
        rows += [{"step": step, "task": t, "metric": "greedy", "value": v, "n": 32}
                 for t, v in acc.items()]  # fmt: skip
    return rows + [{"step": 8, "task": "all", "metric": "pass1", "value": 0.7, "n": 32}]


def test_accuracy_by_task_pairs_the_first_and_last_evaluation_all_first():
    assert accuracy_by_task(_evals()) == {"all": (0.4, 0.9), "add": (0.5, 1.0), "sub": (0.3, 0.3)}


def test_the_report_opens_with_before_and_after_and_keeps_every_figure(tmp_path):
    summary = {"run_id": "r", "sampler": "ppm", "rl_steps": 8, "pretrain_steps": 60,
               "zero_variance_share": 0.25, "policy_lag_histogram": {"0": 3, "1": 5},
               "rss_mb_end": {"trainer": 900.0}, "odd_figure": 7}  # fmt: skip
    lines = headline(summary, _evals())
    assert lines[0].startswith("## Before and after RL")
    assert "| add | 50.0% | 100.0% | +50.0 points |" in lines
    assert "| groups with no learning signal (all right or all wrong) | 25.0% |" in lines
    report = write_report(tmp_path, summary, RunView(evals=_evals())).read_text()
    assert report.index("Before and after") < report.index("## Curves") < report.index("<details>")
    assert "| odd_figure | 7 |" in report and "| trainer | 900.0 |" in report
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
