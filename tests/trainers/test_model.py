import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlstream.config import ModelConfig
from rlstream.trainers.lm import CHARS, EOS, Tokenizer, build_model, token_logprobs
from rlstream.trainers.sampling import sample

TOK = Tokenizer.char()


@given(st.text(alphabet=CHARS + EOS, max_size=64))
def test_tokenizer_round_trip(text):
    assert TOK.decode(TOK.encode(text)) == text
    assert len(TOK.encode(text)) == len(text)  # one token per character


def test_batch_encoding_equals_one_text_at_a_time_for_char_and_bpe_tokenizers():
    """encode_batch goes to the Rust tokenizer directly: the ids are what transformers' own
    call gives, text by text, for both kinds of tokenizer (and documents end in EOS)."""
    texts = ["012+034=046", "", "12*4=?12*4\n48\n48", "a b  c", "#123 at 3 to 7:"]
    bpe = Tokenizer.bpe(texts * 50, 300)
    for tok in (Tokenizer.char(), bpe):
        expected = [tok.hf.encode(t, add_special_tokens=False) for t in texts]
        assert tok.encode_batch(texts) == expected
        assert tok.hf(texts, add_special_tokens=False)["input_ids"] == expected
        end = tok.encode(EOS)[-1]  # the char tokenizer's EOS; a byte-level BPE's newline
        assert [d[-1] for d in tok.encode_documents([t + EOS for t in texts])] == [end] * 5


def test_tokenizer_rejects_unknown_characters():
    with pytest.raises(ValueError, match="not in the tokenizer"):
        TOK.encode("caf\u00e9")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(ModelConfig(block_size=32, n_layer=2, n_head=2, n_embd=32), TOK).eval()


PROMPTS = ["037+085=", "1+2=", "word problem: "]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_kv_cache_sampling_equals_no_cache(model, temperature, top_p):
    kw = dict(n=4, max_new_tokens=10, temperature=temperature, top_p=top_p, stop=("\n", "5"))
    a = sample(model, TOK, PROMPTS, generator=torch.Generator().manual_seed(1), **kw)
    b = sample(
        model, TOK, PROMPTS, use_cache=False, generator=torch.Generator().manual_seed(1), **kw
    )
    assert a.tokens == b.tokens and a.texts == b.texts
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert x == pytest.approx(y, abs=1e-5)


def test_sampling_layout_stop_tokens_and_logprobs(model):
    s = sample(
        model,
        TOK,
        PROMPTS,
        n=3,
        max_new_tokens=12,
        stop=("5",),
        generator=torch.Generator().manual_seed(2),
    )
    assert s.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    stop = TOK.encode("5")[0]
    for toks, text, lps, why in zip(s.tokens, s.texts, s.logprobs, s.finish_reasons, strict=True):
        assert len(lps) == len(toks) and all(lp <= 0 for lp in lps)
        assert why == ("stop" if toks[-1] in (stop, TOK.eos_id) else "length")
        assert stop not in toks[:-1] and "5" not in text  # generation ends at the stop token
        assert TOK.eos_id not in toks[:-1] and EOS not in text  # ... and always at EOS
        assert len(toks) == 12 or toks[-1] in (stop, TOK.eos_id)
    # the sampler's logprobs equal an unpadded forward pass over prompt + completion
    for i, p in enumerate(s.prompt_index):
        seq = torch.tensor([TOK.encode(PROMPTS[p]) + s.tokens[i]])
        lp = token_logprobs(model(seq[:, :-1]), seq[:, 1:])[0, len(PROMPTS[p]) - 1 :]
        assert lp.tolist() == pytest.approx(s.logprobs[i], abs=1e-5)


def test_greedy_is_deterministic_and_top_p_tiny_is_greedy(model):
    g = sample(model, TOK, PROMPTS, n=2, max_new_tokens=6, temperature=0)
    assert g.tokens[0] == g.tokens[1]
    t = sample(
        model,
        TOK,
        PROMPTS,
        n=2,
        max_new_tokens=6,
        top_p=1e-6,
        generator=torch.Generator().manual_seed(3),
    )
    assert t.tokens == g.tokens


def test_value_head_and_context_limit():
    m = build_model(ModelConfig(block_size=8, n_layer=1, n_head=1, n_embd=8), TOK, value_head=True)
    logits, values = m(torch.zeros(2, 5, dtype=torch.long), values=True)
    assert logits.shape == (2, 5, TOK.vocab_size) and values.shape == (2, 5)
    with pytest.raises(ValueError, match="block_size"):
        sample(m, TOK, ["1234567"], max_new_tokens=4)
