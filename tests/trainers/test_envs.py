import random
from dataclasses import replace

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


BUILT_IN = ("add", "sub", "mul", "chain", "countdown", "word")


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_worked_solution_verifies_by_its_final_answer_and_a_flawed_one_errs_in_its_steps(name):
    from rlstream.trainers.envs.cot import final_answer

    family, cot = get_task(name), get_task(f"cot:{name}")
    rng, flawed_seen = random.Random(0), 0
    for _ in range(400):
        p = cot.generate(rng, rng.choice(family.difficulties))
        assert p.verifier == f"cot:{name}" and p.task == name
        solution = cot.solution(p)
        assert verify(solution, p)  # the verifier reads the tag...
        assert not verify(p.answer, p)  # ...and a completion without one is wrong
        assert verify("steps that are all wrong<answer>" + p.answer + "</answer>", p)  # only it
        flawed = cot.solution(p, flawed=True)
        assert (flawed is None) == (family.flawed_answer(p) is None)
        if flawed is not None:
            flawed_seen += 1
            steps, wrong = flawed.split("<answer>")[0], final_answer(flawed)
            assert wrong == family.flawed_answer(p) and not verify(flawed, p)
            if steps == solution.split("<answer>")[0]:  # only the top digits carried:
                assert name in ("add", "mul") and wrong[:-1] == p.answer[:-1]  # carry dropped
            else:  # the mistake is made in the steps, and the answer follows from them
                assert wrong != p.answer
    assert flawed_seen > 0 or name == "countdown"


def test_worked_solutions_are_the_textbook_steps():
    def solved(task: str, text: str) -> tuple[str, str | None]:
        p = replace(get_task(task).generate(random.Random(0), 1), text=text)
        if task == "word":
            p = replace(p, answer=str(int(text.split()[2]) - int(text.split()[7].rstrip("."))))
        cot = get_task(f"cot:{task}")
        return cot.solution(p), cot.solution(p, flawed=True)

    assert solved("add", "037+085=") == (
        "7+5=12;3+8+1=12;0+0+1=1<answer>2210</answer>",
        "7+5=12;3+8=11;0+0=0<answer>2100</answer>",  # every carry dropped
    )
    assert solved("sub", "085-037=") == (
        "15-7=8;8-3-1=4;0-0=0<answer>840</answer>",
        "15-7=8;8-3=5;0-0=0<answer>850</answer>",  # the borrow never taken
    )
    assert solved("mul", "037*4=") == (
        "7*4=28;3*4+2=14;0*4+1=1<answer>8410</answer>",
        "7*4=28;3*4=12;0*4=0<answer>8200</answer>",  # the carries between products dropped
    )
    assert solved("chain", "037+085-020=") == (
        "37+85=122;122-20=102<answer>2010</answer>",
        "37+85=112;112-20=92<answer>2900</answer>",  # the units carry forgotten
    )
    assert solved("word", "bob has 9 pens and gives away 5. how many pens? ") == (
        "9-5=4<answer>4</answer>",
        "9-5=5<answer>5</answer>",  # off by one
    )
    p = replace(get_task("countdown").generate(random.Random(0), 2), answer="3*5+7")
    assert get_task("cot:countdown").solution(p) == "3*5=15;15+7=22<answer>3*5+7</answer>"


def test_the_cot_format_reaches_the_generated_prompts_and_corpus():
    from rlstream.config import ConfigError, load_config
    from rlstream.trainers.datasets import generated_corpus_rows, generated_prompt_rows

    cfg = load_config(None, ["data.format=cot", "data.tasks=add,mul", "data.corpus_docs=500",
                             "eval.prompts=16"])  # fmt: skip
    rows = generated_prompt_rows(cfg, "d")
    assert {r["verifier"] for r in rows} == {"cot:add", "cot:mul"}
    docs = [r["text"] for r in generated_corpus_rows(cfg, "d")]
    assert all(d.endswith("</answer>\n") and ";" in d for d in docs)
    flawed = [d for d in docs if not verify(d.split("=", 1)[1], _prompt_of(d))]
    assert 0 < len(flawed) < len(docs)  # data.flaw_rate of the flawable ones, in the steps
    with pytest.raises(ConfigError, match="data.format: cot: task 'rg:gcd' has no worked"):
        load_config(None, ["data.format=cot", "data.tasks=rg:gcd"])
    with pytest.raises(ConfigError, match="data.format: 'steps' is not one of direct, cot"):
        load_config(None, ["data.format=steps"])


def test_the_cot_format_brings_room_for_a_worked_solution_unless_told_otherwise():
    from rlstream.config import ConfigError, format_defaults, load_config
    from rlstream.trainers.envs.cot import in_format

    cfg = load_config(None, [], {"data.format": "cot"})  # `rlstream run --format cot`
    assert (cfg.model.block_size, cfg.rl.max_new_tokens) == (96, 64)
    mix = TaskMix.parse("add,sub,mul,chain,countdown")
    prompts = [in_format(p, "cot") for p in sample_prompts(mix, 2000, "train", seed=0)]
    longest = max(len(get_task(p.verifier).solution(p)) for p in prompts)  # char tokens
    assert longest <= cfg.rl.max_new_tokens
    assert max(len(p.text) for p in prompts) + longest <= cfg.model.block_size
    given = load_config(None, ["data.format=cot", "model.block_size=64"])
    assert (given.model.block_size, given.rl.max_new_tokens) == (64, 64)
    direct = load_config(None, [])
    assert (direct.model.block_size, direct.rl.max_new_tokens) == (32, 8)
    # a config submitted over HTTP is read the same way
    assert format_defaults({"data": {"format": "cot"}, "rl": {"steps": 3}}) == {
        "model": {"block_size": 96},
        "rl": {"max_new_tokens": 64, "steps": 3},
        "data": {"format": "cot"},
    }
    with pytest.raises(ConfigError, match="data"):  # one line naming the field, as before
        load_config(None, [], {"data": "cot"})


def _prompt_of(document: str):
    text = document.split("=", 1)[0] + "="
    task = "add" if "+" in text else "mul"
    a, b = (int(n) for n in text.rstrip("=").replace("+", " ").replace("*", " ").split())
    value = a + b if task == "add" else a * b
    width = 4
    return replace(get_task(task).generate(random.Random(0), 1), text=text, task=task,
                   answer=encode_number(value, width), verifier=f"cot:{task}")  # fmt: skip
