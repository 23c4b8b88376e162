import random

import pytest

from rlstream.trainers.envs import TASKS, TaskMix, get_task, make_prompt_id, sample_prompts, verify
from rlstream.trainers.envs.arithmetic import decode_number, encode_number
from rlstream.trainers.envs.base import register_task
from rlstream.trainers.pretrain import build_corpus

BUILTIN = ["add", "sub", "mul", "chain", "countdown", "word"]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_family_verifies_its_own_answer_and_rejects_its_flaw(name):
    family, rng = get_task(name), random.Random(0)
    for d in family.difficulties:
        for _ in range(50):
            p = family.generate(rng, d)
            assert p.task == name and p.difficulty == d
            assert p.prompt_id == make_prompt_id(name, p.text)
            assert verify(p.answer, p) and verify(f" {p.answer} ", p)
            assert not verify(p.answer + "9", p)
            flawed = family.flawed_answer(p)
            if flawed is not None:
                assert not verify(flawed, p), (p, flawed)


def test_prompt_rows_are_plain_str_and_int():
    p = get_task("add").generate(random.Random(1), 2)
    row = p.to_row()
    assert set(row) == {"prompt_id", "text", "task", "difficulty", "answer", "verifier"}
    assert all(type(v) in (str, int) for v in row.values())


def test_padded_reversed_format():
    assert encode_number(122, 4) == "2210" and decode_number("2210") == 122
    p = get_task("add").generate(random.Random(3), 3)
    a, b = (int(x) for x in p.text.rstrip("=").split("+"))
    assert decode_number(p.answer) == a + b and len(p.answer) == 4


def test_systematic_flaws_are_the_textbook_mistakes():
    from rlstream.trainers.envs.base import make_prompt

    add = make_prompt("add", "037+085=", encode_number(122, 4), 2)
    assert decode_number(get_task("add").flawed_answer(add)) == 12  # 7+5 -> 2, 3+8 -> 1: no carries
    sub = make_prompt("sub", "052-017=", encode_number(35, 3), 2)
    assert decode_number(get_task("sub").flawed_answer(sub)) == 45  # 2-7 -> 5, borrow forgotten
    no_carry = make_prompt("add", "012+013=", encode_number(25, 4), 2)
    assert get_task("add").flawed_answer(no_carry) is None


def test_countdown_accepts_any_valid_expression():
    p = get_task("countdown").generate(random.Random(5), 2)
    assert verify(p.answer, p)
    assert not verify("1+", p) and not verify("__import__('os')", p)


def test_splits_are_disjoint_and_reproducible():
    mix = TaskMix.parse("add,sub,chain")
    train = sample_prompts(mix, 500, "train", seed=7)
    held = sample_prompts(mix, 200, "heldout", seed=7)
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in held}
    assert held == sample_prompts(mix, 200, "heldout", seed=7)
    assert held != sample_prompts(mix, 200, "heldout", seed=8)
    corpus = build_corpus(mix, 2000, 0.0, seed=1, split_seed=7)
    held_text = {p.text for p in held}
    assert not any(d.split("=")[0] + "=" in held_text for d in corpus)


def test_mix_parse_weights_and_difficulties():
    mix = TaskMix.parse("add:3,mul@1-2")
    assert mix.weights == {"add": 3.0, "mul": 1.0} and mix.difficulties == {"mul": (1, 2)}
    rng = random.Random(0)
    assert all(p.difficulty <= 2 for p in (mix.draw(rng) for _ in range(100)) if p.task == "mul")
    with pytest.raises(KeyError, match="unknown task family"):
        TaskMix.parse("nope")


def test_registry_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        register_task(TASKS["add"])


def test_reasoning_gym_adapter():
    pytest.importorskip("reasoning_gym")
    family = get_task("rg:basic_arithmetic")
    p = family.generate(random.Random(0), 1)
    assert p.task == "rg:basic_arithmetic" and p.text and verify(p.answer, p)
    assert not verify("not a number", p)


def test_small_task_spaces():
    mix = TaskMix.parse("mul@1")  # 10 x 8 prompts in all
    with pytest.raises(ValueError, match="task space is small"):
        sample_prompts(mix, 100, "heldout", seed=0)
    few = sample_prompts(mix, 100, "heldout", seed=0, strict=False)
    assert 0 < len(few) < 100 and len({p.prompt_id for p in few}) == len(few)
