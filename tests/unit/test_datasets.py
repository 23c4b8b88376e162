"""A run's dataset from rows (pure): splits, de-duplication, admission, the corpus fallback."""

from __future__ import annotations

from rlstream.config import Config
from rlstream.schemas import get, prepare_row
from rlstream.trainers.datasets import (
    DatasetView,
    generated_prompt_rows,
    prompt_of_row,
    prompt_problem,
    split_of_row,
    usable,
    verifier_problem,
)
from rlstream.trainers.envs import verify
from rlstream.trainers.lm import Tokenizer

PROMPTS = get("prompts")


def _row(text: str, answer: str, dataset: str = "quiz", **extra) -> dict:
    return prepare_row(
        PROMPTS, {"text": text, "task": "numeric", "answer": answer, **extra}, dataset
    )


def test_republishing_a_prompt_does_not_duplicate_it_and_other_datasets_stay_out():
    view = DatasetView("quiz")
    rows = [_row(f"{a}+1=", str(a + 1), split="train") for a in range(10)]
    for row in rows + rows:  # published twice: same (dataset, prompt_id), same event id
        view.add_prompt(row)
    assert len(view.pool) == 10
    assert view.add_prompt(_row("1+1=", "2", dataset="other")) is None
    assert len(view.pool) == 10


def test_held_out_prompts_never_join_the_pool():
    view = DatasetView("quiz", heldout_frac=0.3)
    rows = [_row(f"{a}*3=", str(3 * a)) for a in range(200)]  # no split column: carved by id
    for row in rows:
        view.add_prompt(row)
    carved = {r["prompt_id"] for r in rows if split_of_row(r, 0.3) == "heldout"}
    assert 30 < len(carved) < 90 and set(view.heldout) == carved
    assert not carved & {p.prompt_id for p in view.pool.values()}
    # a prompt held out later leaves the pool; one trained later stays held out
    moved = next(iter(view.pool.values()))
    view.add_prompt(_row(moved.text, moved.answer, split="heldout"))
    assert moved.prompt_id in view.heldout
    assert moved.prompt_id not in {p.prompt_id for p in view.pool.values()}
    assert view.add_prompt(_row(moved.text, moved.answer, split="train")) == "heldout"


def test_the_generated_pool_keeps_repeated_draws():
    cfg = Config(run_id="t")
    cfg.data.pool_size, cfg.eval.prompts = 600, 20
    rows = generated_prompt_rows(cfg, "gen")
    view = DatasetView("gen")
    for row in rows:
        view.add_prompt(row)
    assert len(view.pool) == 600 and len(view.heldout) == 20
    assert len({p.prompt_id for p in view.pool.values()}) < 600  # 1-digit sums repeat


def test_admission_names_the_reason():
    tok = Tokenizer.char()
    ok = {"prompt_id": "a", "text": "3+4=", "task": "numeric", "answer": "7"}
    assert prompt_problem(ok, tok, 24) is None
    cases = {
        "names no verifier": ok | {"task": "algebra"},
        "is not a number": ok | {"answer": "seven"},
        "has no answer": ok | {"task": "exact", "answer": ""},
        "not in the model's alphabet": ok | {"text": "3+4=\u00bf"},
        "room for 24": ok | {"text": "1" * 25},
    }
    for reason, row in cases.items():
        assert reason in prompt_problem(row, tok, 24), reason
    assert "newline" in prompt_problem(ok | {"text": "3\n+4="}, tok, 24)
    assert verifier_problem(ok | {"text": "\u00bf"}) is None  # text needs the model: run time


def test_a_dataset_without_documents_pre_trains_on_its_train_answers():
    cfg = Config(run_id="t")
    view = DatasetView("quiz")
    for a in range(40):
        view.add_prompt(_row(f"{a}+2=", str(a + 2), split="heldout" if a % 4 == 0 else "train"))
    view.add_prompt(_row("caf\u00e9=", "1", split="train"))
    data = usable(view, cfg, Tokenizer.char())
    assert sorted(data.docs) == sorted(f"{a}+2={a + 2}\n" for a in range(40) if a % 4)
    assert all(d.split("+")[0] in {str(a) for a in range(0, 40, 4)} for d in data.validation)
    assert data.refused["train_prompts"] == 1 and len(data.eval_set) == 10


def test_the_math_verifier_reads_the_final_answer_in_any_usual_format():
    from rlstream.trainers.envs import Prompt, get_task, verify

    half = Prompt("p", "1/2 as a decimal?", "quiz", 0, "0.5", verifier="math")
    assert verify(r"It is one half: \boxed{\frac{1}{2}}", half)
    assert verify("halve 1\n#### 0.5", half) and verify("<answer>1/2</answer>", half)
    assert not verify(r"\boxed{0.25}", half) and not verify(r"\boxed{\frac{1}{2}", half)
    math = get_task("math")
    assert math.answer_problem("") and math.answer_problem("zz??") and not math.answer_problem("3")
    # the verifier column beats the task: the same prompt under `exact` needs the raw text
    assert not verify(r"\boxed{0.5}", Prompt("p", "?", "quiz", 0, "0.5", verifier="exact"))
    assert verifier_problem({"task": "quiz", "verifier": "math", "answer": "2"}) is None
    assert "verifier 'latex'" in verifier_problem({"task": "quiz", "verifier": "latex"})


def test_a_reasoning_gym_export_is_a_prompt_file_its_verifier_checks_anywhere(tmp_path):
    """`rlstream datasets export rg:gcd` rows pass publish's checks, and a verifier in another
    process (no cached entries) scores them by the dataset's scorer on the reference answer."""
    import json

    from typer.testing import CliRunner

    from rlstream.cli import app
    from rlstream.trainers.envs.rgym import ReasoningGymTask

    out = tmp_path / "gcd.jsonl"
    result = CliRunner().invoke(
        app, ["datasets", "export", "rg:gcd", "--size", "12", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [prepare_row(PROMPTS, json.loads(line), "gcd") for line in out.read_text().splitlines()]
    assert len(rows) == 12 and all(verifier_problem(r) is None for r in rows)
    fresh = ReasoningGymTask("gcd")
    prompt = prompt_of_row(rows[0])
    assert prompt.verifier == "rg:gcd" and "\n" not in prompt.text
    assert fresh.verify(f" {prompt.answer} ", prompt)
    assert not fresh.verify(str(int(prompt.answer) + 1), prompt)
    # the default char model's context cannot take the questions: refused, with the reason
    assert "room for 24" in prompt_problem(rows[0], Tokenizer.char(), 24)
    cot = tmp_path / "gcd-cot.jsonl"
    result = CliRunner().invoke(app, ["datasets", "export", "rg:gcd", "--size", "12",
                                      "--format", "cot", "--out", str(cot)])  # fmt: skip
    assert result.exit_code == 0, result.output
    row = prepare_row(PROMPTS, json.loads(cot.read_text().splitlines()[0]), "gcd")
    prompt = prompt_of_row(row)
    assert prompt.verifier == "cot:rg:gcd" and verifier_problem(row) is None
    assert verify(f"gcd by Euclid, step by step<answer>{prompt.answer}</answer>", prompt)
    assert not verify(prompt.answer, prompt)  # no tag: wrong in this format


def test_a_restarted_scheduler_lines_its_pool_up_with_the_snapshot():
    """Partitions interleave differently on every read: the snapshot's order wins, and the
    prompts that joined after it follow in the order they were read."""
    from rlstream.streams.prompt_feed import in_snapshot_order
    from rlstream.trainers.envs import Prompt

    entries = [(f"e{i}", Prompt(f"p{i}", "t", "exact", 0, "a")) for i in range(6)]
    reread = [entries[i] for i in (4, 2, 0, 5, 1, 3)]
    ordered = in_snapshot_order(reread, ["e0", "e1", "e2", "e3"])
    assert [key for key, _ in ordered] == ["e0", "e1", "e2", "e3", "e4", "e5"]
