"""The PPM's policy featurizers and the policy-reading PPM sampler, shared by the selection
bench (one policy, trained in place) and the streaming scheduler (the newest announced policy).

- `reference`: the policy's probability of the prompt's reference answer at the rollout
  temperature (one teacher-forced pass; the pass rate itself under an exact-match verifier);
- `confidence`: its probability of its own greedy answer (one greedy decode, no reference);
- `hidden`: its final-layer state at the prompt's last token;
- `text`: hashed character n-grams (no policy).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from rlstream.trainers.envs import Prompt
from rlstream.trainers.lm import EOS
from rlstream.trainers.policy import Policy
from rlstream.trainers.sampling import sample
from rlstream.trainers.selection.features import (
    ConcatFeaturizer,
    HiddenStateFeaturizer,
    TextFeaturizer,
)
from rlstream.trainers.selection.ppm import PPMArgs, PromptPredictiveModel
from rlstream.trainers.selection.predictive import PredictiveArgs, PredictiveSampler

PPM_FEATURES = ("reference", "confidence", "hidden", "text")


def check_features(spec: str) -> list[str]:
    """The featurizer names in a comma-separated spec; an unknown one is a ValueError."""
    names = [f.strip() for f in spec.split(",") if f.strip()]
    if not names or not set(names) <= set(PPM_FEATURES):
        raise ValueError(
            f"ppm_features: comma-separated from {', '.join(PPM_FEATURES)}; got {spec!r}"
        )
    return names


@torch.no_grad()
def last_token_hidden(policy: Policy, prompts: list[Prompt]) -> np.ndarray:
    """(N, n_embd): the policy's final-layer state at each prompt's last token ('=')."""
    m, out = policy.model, np.zeros((len(prompts), policy.model.config.n_embd), np.float32)
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[len(p.text)].append(i)
    for length, idx in by_len.items():
        x = torch.tensor([policy.tok.encode(prompts[i].text) for i in idx])
        h = m.wte(x) + m.wpe(torch.arange(length))  # (n, T, C)
        for block in m.h:
            h = block(h)
        out[idx] = m.ln_f(h)[:, -1].numpy()
    return out


@torch.no_grad()
def greedy_confidence(policy: Policy, prompts: list[Prompt], max_new_tokens: int) -> np.ndarray:
    """(N, 3): the policy's probability of its own greedy answer, its mean and min token log-prob.

    One greedy decode, no reference answer and no verifier: a confident policy gives a group
    that is all the same (all right or all wrong), an unsure one a mixed, informative group."""
    s = sample(policy.model, policy.tok, [p.text for p in prompts], 1, max_new_tokens, 0.0)
    out = np.zeros((len(prompts), 3), np.float32)
    for i, lp in enumerate(s.logprobs):
        lp = np.asarray(lp or [0.0])
        out[i] = (np.exp(lp.sum()), lp.mean() / 4, lp.min() / 4)
    return out


@torch.no_grad()
def reference_likelihood(
    policy: Policy, prompts: list[Prompt], temperature: float, max_new_tokens: int
) -> np.ndarray:
    """(N, 3): the policy's probability of the reference answer and its stop token at the
    rollout temperature, that log-probability / 8, and the least likely token's log-prob / 4.

    One teacher-forced forward pass, no sampling. For an exact-match verifier this probability
    is the pass rate of a temperature sample (up to whitespace variants); for free-form answers
    (chains of thought) it is only a proxy. An answer longer than `max_new_tokens` cannot be
    sampled: probability 0, log-probabilities at the -30 floor."""
    m, tok = policy.model, policy.tok
    t, floor = max(temperature, 1e-3), -30.0
    out = np.tile(np.float32([0.0, floor / 8, floor / 4]), (len(prompts), 1))
    by_len: dict[int, list[int]] = defaultdict(list)
    enc = tok.encode_batch([tok.format_prompt(p.text) + p.answer + EOS for p in prompts])
    texts = tok.encode_prompts([p.text for p in prompts])
    answer_len = [len(e) - len(q) for e, q in zip(enc, texts, strict=True)]
    for i, e in enumerate(enc):
        if answer_len[i] <= max_new_tokens and len(e) <= m.block_size + 1:
            by_len[len(e)].append(i)
    for length, idx in by_len.items():
        x = torch.tensor([enc[i] for i in idx])
        n_ans = torch.tensor([answer_len[i] for i in idx])
        logp = torch.log_softmax(m(x[:, :-1]).float() / t, -1)
        lp = logp.gather(-1, x[:, 1:, None]).squeeze(-1)  # (n, T-1): log p(token t+1)
        cols = torch.arange(length - 1)[None]
        ans = cols >= (length - 1 - n_ans)[:, None]
        lp = lp.clamp(min=floor)
        total = (lp * ans).sum(1).clamp(min=floor)
        low = lp.masked_fill(~ans, 0.0).min(1).values
        out[idx] = torch.stack([total.exp(), total / 8, low / 4], 1).numpy()
    return out


def tuned_args() -> PredictiveArgs:
    """The PPM-sampler settings tuned on the selection bench's default pool (see the README):
    128 candidates, a prior worth 16 rollouts at full skill, 40 fit steps, hard tilt 2."""
    return PredictiveArgs(candidate_pool=128, prior_strength=16, fit_steps=40, hard_tilt=2.0)


def make_policy_ppm_sampler(
    pool: list[Prompt],
    seed: int,
    policy: Callable[[], Policy],
    features: list[str],
    args: PredictiveArgs,
    temperature: float,
    max_new_tokens: int,
) -> PredictiveSampler:
    """The PPM sampler reading `features` of `policy()` (called at every scoring, so it can
    return a newer policy each time; call `sampler.ppm.refresh_features()` when it changes)."""
    T, n_new = temperature, max_new_tokens

    def part(name: str):  # text needs no policy; hidden asks it for its width
        if name == "text":
            return TextFeaturizer()
        if name == "reference":
            return HiddenStateFeaturizer(lambda ps: reference_likelihood(policy(), ps, T, n_new), 3)
        if name == "confidence":
            return HiddenStateFeaturizer(lambda ps: greedy_confidence(policy(), ps, n_new), 3)
        dim = policy().model.config.n_embd
        return HiddenStateFeaturizer(lambda ps: last_token_hidden(policy(), ps), dim)

    parts = [part(f) for f in features]
    ppm = PromptPredictiveModel(PPMArgs(seed=seed), featurizer=ConcatFeaturizer(parts))
    # diversity is measured on the prompts' text, not on the policy features the PPM reads
    # (spreading picks over confidence would push them to the uninformative extremes)
    text = TextFeaturizer()
    return PredictiveSampler(pool, seed, args=args, ppm=ppm, embeddings=text(pool), embedder=text)
