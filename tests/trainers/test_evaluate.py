"""The shared held-out evaluator: its keys, per-family figures, determinism and registry."""

import pytest
import torch

from rlstream.config import ModelConfig
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.evaluate import EVALUATORS, evaluate, register_evaluator
from rlstream.trainers.lm import Tokenizer, build_model

TOK = Tokenizer.char()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(ModelConfig(block_size=24, n_layer=1, n_head=2, n_embd=32), TOK).eval()


PROMPTS = sample_prompts(TaskMix.parse("add@1,sub@1"), 12, "heldout", seed=0, strict=False)


def test_evaluate_reports_greedy_pass1_and_per_family_figures(model):
    ev = evaluate(model, TOK, PROMPTS, max_new_tokens=4, k=3, temperature=1.0, seed=5)
    assert set(ev) == {"greedy", "greedy_by_task", "pass1", "pass1_by_task", "pass_rates"}
    families = {p.task for p in PROMPTS}
    assert set(ev["greedy_by_task"]) == families == set(ev["pass1_by_task"])
    assert len(ev["pass_rates"]) == len(PROMPTS)
    assert all(r in (0, 1 / 3, 2 / 3, 1) for r in ev["pass_rates"])  # k = 3 samples each
    assert ev["pass1"] == pytest.approx(sum(ev["pass_rates"]) / len(PROMPTS))
    assert 0 <= ev["greedy"] <= 1
    again = evaluate(model, TOK, PROMPTS, max_new_tokens=4, k=3, temperature=1.0, seed=5)
    assert again == ev  # its own generator: same seed, same figures


def test_without_samples_only_greedy_is_measured(model):
    ev = evaluate(model, TOK, PROMPTS, max_new_tokens=4, k=0, temperature=1.0, seed=0)
    assert set(ev) == {"greedy", "greedy_by_task"}


def test_evaluator_registry_rejects_a_duplicate_name():
    assert {"greedy", "pass1"} <= set(EVALUATORS)
    before = EVALUATORS["greedy"]
    with pytest.raises(ValueError, match="greedy"):
        register_evaluator("greedy")(lambda *a: [])
    assert EVALUATORS["greedy"] is before


def test_a_registered_evaluator_is_reported(model):
    register_evaluator("always_test")(lambda model, tok, prompts, *rest: [1.0] * len(prompts))
    try:
        ev = evaluate(model, TOK, PROMPTS, max_new_tokens=4, k=0, temperature=1.0, seed=0)
        assert ev["always_test"] == 1.0
        assert set(ev["always_test_by_task"].values()) == {1.0}
    finally:
        del EVALUATORS["always_test"]
