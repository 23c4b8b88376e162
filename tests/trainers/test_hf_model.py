"""A user's Hugging Face checkpoint as the policy: a tiny random Qwen2 / Llama with a byte-level
BPE tokenizer (no pad token, EOS pads) samples, trains in the local loop, and what it writes
loads with plain transformers."""

import subprocess
import sys

import pytest
import torch

from rlstream.config import ModelConfig
from rlstream.trainers.lm import Tokenizer, build_model, load_tokenizer, token_logprobs
from rlstream.trainers.local import LocalOptions, train_local
from rlstream.trainers.sampling import sample
from tests.hf_models import CHAT, tiny_model_dir, weights
from tests.trainers.test_local import tiny

PROMPTS = ["037+085=", "1+2=", "999-123="]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request, tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_a_subword_tokenizer_without_pad_pads_with_eos_and_stops_on_newline_tokens(model_dir):
    tok = Tokenizer.load(model_dir)
    assert not tok.is_char and tok.pad_id == tok.eos_id
    stops = tok.stop_ids(("\n",))
    assert tok.eos_id in stops and len(stops) >= 2  # "\n" and the merges that hold it
    assert all("\n" in tok.decode([i]) for i in stops - {tok.eos_id})


def test_sampling_a_users_model_matches_a_teacher_forced_pass_and_the_uncached_sampler(model_dir):
    tok = Tokenizer.load(model_dir)
    model = build_model(ModelConfig(path=str(model_dir), block_size=48), tok).eval()
    kw = dict(n=3, max_new_tokens=12, stop=("\n",))
    a = sample(model, tok, PROMPTS, generator=torch.Generator().manual_seed(0), **kw)
    b = sample(
        model, tok, PROMPTS, use_cache=False, generator=torch.Generator().manual_seed(0), **kw
    )
    assert a.tokens == b.tokens and a.texts == b.texts
    for i, p in enumerate(a.prompt_index):
        prompt = tok.encode(PROMPTS[p])
        seq = torch.tensor([prompt + a.tokens[i]])
        lp = token_logprobs(model(seq[:, :-1]), seq[:, 1:])[0, len(prompt) - 1 :]
        assert lp.tolist() == pytest.approx(a.logprobs[i], abs=1e-5)
        assert "\n" not in a.texts[i] and tok.decode(a.tokens[i]).startswith(a.texts[i])


def test_the_local_loop_trains_a_users_model_and_writes_a_loadable_directory(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "qwen2", "qwen2")  # Llama trains in the LoRA test
    out = tmp_path / "out"
    cfg = tiny(f"model.path={model_dir}", "model.block_size=48")
    summary = train_local(cfg, LocalOptions(out_dir=str(out), progress=False))
    assert summary["rl_steps"] == 4
    before, after = weights(model_dir), weights(out / "model")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    script = (
        "import sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "ids = tok('037+085=', return_tensors='pt').input_ids\n"
        "out = model.generate(ids, max_new_tokens=4, do_sample=False,\n"
        "                     pad_token_id=tok.eos_token_id)\n"
        "assert 'rlstream' not in sys.modules\n"
        "print(out.shape[1] - ids.shape[1])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(out / "model")], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert 1 <= int(done.stdout.split()[-1]) <= 4


def test_a_users_tokenizer_without_a_newline_pre_trains_on_its_own_end_token(tmp_path):
    """Documents end in a newline; a character vocabulary without one (a user's Llama) gets
    its own end-of-sequence token there, instead of a trainer that dies at start."""
    from rlstream.trainers.lm import EOS, Tokenizer
    from rlstream.trainers.pretrain import Corpus

    model_dir = tiny_model_dir(tmp_path / "llama", "llama", tokenizer="chars")
    tok = Tokenizer.load(model_dir)
    assert tok.is_char and tok.unknown(EOS)
    corpus = Corpus(["12+7=19" + EOS, "8+5=13" + EOS], tok, 16)
    assert corpus.data[0, corpus.lens[0] - 1] == tok.eos_id
    assert tok.decode(corpus.data[1, : corpus.lens[1] - 1].tolist()) == "8+5=13"
    summary = train_local(tiny(f"model.path={model_dir}", "model.block_size=48"),
                          LocalOptions(out_dir=str(tmp_path / "out"), progress=False))  # fmt: skip
    assert summary["rl_steps"] == 4


def test_a_hub_id_is_refused_with_the_command_that_fetches_it():
    done = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "train", "--model", "Qwen/Qwen2-0.5B"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "downloads nothing at run time" in done.stderr and "hf download" in done.stderr
    assert "Traceback" not in done.stderr


def test_prompts_go_through_the_chat_template_unless_it_is_off(tmp_path):
    chat = tiny_model_dir(tmp_path / "chat", "qwen2", chat_template=CHAT)
    m = ModelConfig(path=str(chat), block_size=64)
    tok = load_tokenizer(m)
    assert tok.chat
    shown = tok.format_prompt("1+2=")
    assert shown == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    model = build_model(m, tok).eval()
    s = sample(model, tok, ["1+2="], n=2, max_new_tokens=4)
    assert s.prompt_tokens[0] == tok.encode(shown)
    raw = load_tokenizer(ModelConfig(path=str(chat), chat_template="off"))
    assert not raw.chat and raw.format_prompt("1+2=") == "1+2="
    plain = load_tokenizer(ModelConfig(path=str(tiny_model_dir(tmp_path / "plain"))))
    assert not plain.chat  # no template: raw text


def test_lora_trains_only_the_adapters_and_exports_merged_weights(tmp_path):
    base = tiny_model_dir(tmp_path / "base", "llama")
    out = tmp_path / "out"
    cfg = tiny(f"model.path={base}", "model.block_size=48", "model.lora=r=4,alpha=8")
    summary = train_local(cfg, LocalOptions(out_dir=str(out), progress=False))
    assert 0 < summary["trainable_params"] < summary["params"] / 4
    before, after = weights(base), weights(out / "model")
    assert before.keys() == after.keys()  # merged: a plain checkpoint, no adapter tensors
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all("proj" in k for k in changed)  # the adapted linears, nothing else


def test_a_preset_trains_a_byte_level_bpe_on_the_runs_data_and_saves_it_with_the_model(tmp_path):
    from transformers import AutoTokenizer

    from rlstream.trainers.datasets import dataset_name, generated_prompt_rows, train_texts

    out = tmp_path / "out"
    cfg = tiny("model.tokenizer=bpe:300", "data.tasks=add,word", "model.block_size=48")
    texts = set(train_texts(cfg))
    rows = generated_prompt_rows(cfg, dataset_name(cfg))
    assert {r["text"] + r["answer"] + "\n" for r in rows if r["split"] == "train"} <= texts
    held = [r["text"] for r in rows if r["split"] == "heldout"]
    assert held and not any(t.startswith(h) for t in texts for h in held)  # never learned from
    summary = train_local(cfg, LocalOptions(out_dir=str(out), progress=False))
    assert summary["rl_steps"] == 4
    trained = Tokenizer.load(out / "tokenizer")  # trained once, named in the run's config
    assert not trained.is_char and trained.vocab_size == 300 and trained.eos == "<|endoftext|>"
    text = "037+085=122\ncid buys 4 bags of 6 apples. how many apples? 24\n"
    ids = trained.encode(text)
    assert [trained.decode([i]) for i in ids[:3]] == ["0", "3", "7"]  # digits stay single
    assert len(ids) < len(text) - 20  # merges learned from the words
    exported = AutoTokenizer.from_pretrained(str(out / "model"))  # beside the model's weights
    assert exported.get_vocab() == trained.vocab
    assert exported.decode(exported.encode("héllo 12")) == "héllo 12"  # bytes: nothing unknown


def test_a_bad_tokenizer_setting_names_the_field_and_the_fix(tmp_path):
    from rlstream.config import ConfigError

    for spec, fix in (("bpe:10", "260 <= N"), ("words", "char, bpe:N or a tokenizer directory")):
        with pytest.raises(ConfigError, match=f"model.tokenizer: .*{fix}"):
            ModelConfig(tokenizer=spec)
    user = tiny_model_dir(tmp_path / "qwen2", "qwen2")
    with pytest.raises(ConfigError, match="brings its own tokenizer"):
        ModelConfig(path=str(user), tokenizer="bpe:300")
    with pytest.raises(ValueError, match="trained on the run's data"):
        load_tokenizer(ModelConfig(tokenizer="bpe:300"))


def test_the_vocabulary_size_read_without_transformers_matches_the_tokenizers(tmp_path):
    """The stream processors check token ids against the vocabulary they read from
    tokenizer.json alone; it must be the size the loaded tokenizer has."""
    from rlstream.config import ModelConfig
    from rlstream.trainers.lm import load_tokenizer
    from rlstream.trainers.tokens import vocab_size

    qwen = tiny_model_dir(tmp_path / "q", "qwen2")
    chars = tiny_model_dir(tmp_path / "c", "llama", tokenizer="chars")
    for model in (ModelConfig(), ModelConfig(path=str(qwen)), ModelConfig(path=str(chars))):
        assert vocab_size(model) == load_tokenizer(model).vocab_size
