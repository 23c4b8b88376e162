"""The web view's pure parts: the rollouts review's join and filters, the report's HTML."""

import pytest

from rlstream.ops.api.webview import ReviewFilter, _parsed, join_rollouts, render_report


def _rollout(request_id, idx, version, task="add", completion="5"):
    return {"request_id": request_id, "sample_idx": idx, "policy_version": version, "task": task,
            "prompt_id": f"p-{request_id}", "prompt_text": "2+3=", "completion": completion,
            "answer": "5", "finish_reason": "stop", "verifier": None}  # fmt: skip


def _reward(request_id, idx, reward, details=None):
    return {"request_id": request_id, "sample_idx": idx, "reward": reward,
            "correct": reward == 1.0, "verifier": "verifier", "details": details}  # fmt: skip


VERSIONS = [
    {"version": 1, "step": 0, "phase": "pretrain"},
    {"version": 2, "step": 1, "phase": "rl"},
    {"version": 3, "step": 2, "phase": "rl"},
    {"version": 3, "step": 2, "phase": "done"},
]


def test_rollouts_join_their_rewards_newest_first_and_the_first_copy_wins():
    rollouts = [_rollout("a", 0, 1), _rollout("a", 1, 1, completion="6"), _rollout("b", 0, 3),
                _rollout("a", 0, 2, completion="redelivered"), _rollout("c", 0, 3)]  # fmt: skip
    rewards = [_reward("a", 0, 1.0), _reward("a", 1, 0.0, "wrong"), _reward("b", 0, 1.0),
               _reward("a", 0, 0.0)]  # fmt: skip
    rows = join_rollouts(rollouts, rewards, VERSIONS)
    assert [(r["request_id"], r["sample_idx"]) for r in rows] == [("b", 0), ("a", 0), ("a", 1)]
    first = rows[1]
    assert first["completion"] == "5" and first["reward"] == 1.0 and first["step"] == 0
    assert rows[0]["step"] == 2 and rows[2]["details"] == "wrong"
    assert first["verifier"] == "add" and first["scored_by"] == "verifier"  # "c": not scored yet


def test_review_filters_select_by_task_reward_correctness_and_step():
    rows = [{"task": t, "reward": r, "correct": r == 1.0, "step": s}
            for t in ("add", "sub") for r in (0.0, 0.5, 1.0) for s in (None, 1, 5)]  # fmt: skip
    keep = lambda f: [r for r in rows if f.keep(r)]  # noqa: E731
    assert len(keep(ReviewFilter())) == 18
    assert {r["task"] for r in keep(ReviewFilter(task="sub"))} == {"sub"}
    assert {r["reward"] for r in keep(ReviewFilter(min_reward=0.5, max_reward=0.5))} == {0.5}
    assert {r["reward"] for r in keep(ReviewFilter(correct=False))} == {0.0, 0.5}
    assert {r["step"] for r in keep(ReviewFilter(min_step=2))} == {5}
    assert {r["step"] for r in keep(ReviewFilter(max_step=1))} == {1}


def test_blank_form_fields_filter_nothing_and_bad_ones_name_the_field():
    assert _parsed("min_reward", " ", float) is None
    assert _parsed("min_step", "3", int) == 3
    with pytest.raises(ValueError, match="min_reward: 'high' is not a float"):
        _parsed("min_reward", "high", float)


def test_the_report_renders_with_its_plot_served_by_the_api():
    report = "# run x\n\n![curves](curves.png)\n\n| a | b |\n|---|---|\n| 1 | <b> |"
    html = render_report(report, "x")
    assert '<img src="/runs/x/curves.png"' in html and "<table>" in html
    assert "&lt;b&gt;" in html  # raw HTML in a report is shown, not rendered


def test_an_episodes_turns_are_told_apart_on_the_review_page():
    from jinja2 import Environment, FileSystemLoader

    from rlstream.ops.api.webview import WEB

    episode = _rollout("e", 0, 2, task="calc", completion="?12*4\n48\n48\n")
    episode |= {"env_spans": [6, 9], "turns": 2, "stop_reason": "done", "env_error": None}
    [row] = join_rollouts([episode], [_reward("e", 0, 1.0)], VERSIONS)
    assert row["segments"] == [("?12*4\n", False), ("48\n", True), ("48\n", False)]
    assert join_rollouts([_rollout("a", 0, 1)], [_reward("a", 0, 1.0)], VERSIONS)[0][
        "segments"] is None  # fmt: skip
    loader = Environment(loader=FileSystemLoader(WEB / "templates"), autoescape=True)
    found = {"rows": [row], "matched": 1, "total": 1}
    page = loader.get_template("rollouts.html").render(
        found=found, run={"run_id": "r"}, f=ReviewFilter(), auth=False, request=None
    )
    assert '<span class="env">48\n</span>' in page and "2 turns, done" in page
