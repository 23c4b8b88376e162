"""A run's dataset from rows (pure): splits, de-duplication, admission, the corpus fallback."""

from __future__ import annotations

from rlstream.config import Config
from rlstream.schemas import get, prepare_row
from rlstream.trainers.datasets import (
    DatasetView,
    generated_prompt_rows,
    prompt_problem,
    split_of_row,
    usable,
    verifier_problem,
)
from rlstream.trainers.model import CharTokenizer

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
    tok = CharTokenizer()
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
    data = usable(view, cfg, CharTokenizer())
    assert sorted(data.docs) == sorted(f"{a}+2={a + 2}\n" for a in range(40) if a % 4)
    assert all(d.split("+")[0] in {str(a) for a in range(0, 40, 4)} for d in data.validation)
    assert data.refused["train_prompts"] == 1 and len(data.eval_set) == 10
