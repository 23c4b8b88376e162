"""The PPM's featurizers and the PPM sampler, shared by the selection bench (one policy,
trained in place), the in-process loop and the streaming scheduler (the newest policy).

Reference-free (the default, `auto`, is `AUTO_FEATURES` by answer format): nothing reads an
answer.
- `minilm`: all-MiniLM-L6-v2 sentence embedding of the prompt text (computed once per prompt);
- `text`: hashed character n-grams and digit/operator counts (computed once per prompt);
- `hidden`: the policy's last hidden state at the prompt's last token (no answer, no sampling);
- `prefill`: that pass's next-token distribution too (its likeliest first token's probability,
  its entropy) and the hidden state: one forward pass, no decoding;
- `confidence`: its probability of its own greedy answer (one greedy decode).
The labelled variant that reads the reference answer:
- `reference`: the policy's probability of the prompt's reference answer at the rollout
  temperature (one teacher-forced pass; the pass rate itself under an exact-match verifier,
  only a proxy for a chain of thought).
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
from rlstream.trainers.selection.compute import Compute
from rlstream.trainers.selection.features import (
    CachedFeaturizer,
    ConcatFeaturizer,
    Featurizer,
    HiddenStateFeaturizer,
    MiniLMFeaturizer,
    TextFeaturizer,
)
from rlstream.trainers.selection.ppm import PPMArgs, PromptPredictiveModel
from rlstream.trainers.selection.predictive import PredictiveArgs, PredictiveSampler

STATIC_FEATURES = ("minilm", "text")
"""Featurizers that read no policy: computed once per prompt; a PPM of only these needs no
policy at all (the scheduler then follows no policy versions)."""


def reads_policy(features: list[str]) -> bool:
    return any(f not in STATIC_FEATURES for f in features)


def static_featurizer(features: list[str]) -> Featurizer:
    """The prompt vectors the sampler spreads its picks over and the neighbourhood is searched
    in (the run's Qdrant collection): the first static featurizer named, else char n-grams
    (spreading picks over policy features would push them to the uninformative extremes)."""
    static = [f for f in features if f in STATIC_FEATURES] or ["text"]
    return CachedFeaturizer(MiniLMFeaturizer() if static[0] == "minilm" else TextFeaturizer())


def hidden_size(policy: Policy) -> int:
    return policy.model.lm.config.get_text_config().hidden_size


@torch.no_grad()
def _prompt_pass(policy: Policy, prompts: list[Prompt], cost: Compute | None):
    """One forward pass over each prompt, as the policy sees it (its chat template, if any):
    ((N, hidden) last hidden state at the last token, (N, vocab) next-token log-probabilities
    there). Prompts of one length share a pass; `cost` counts the prompt tokens read."""
    m, tok = policy.model, policy.tok
    enc = tok.encode_prompts([p.text for p in prompts])
    if cost is not None:
        cost.add(prefilled=sum(min(len(e), m.block_size) for e in enc))
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(enc):
        by_len[min(len(e), m.block_size)].append(i)
    device = next(m.parameters()).device
    hidden = logp = None
    for length, idx in by_len.items():
        x = torch.tensor([enc[i][-length:] for i in idx], device=device)
        out = m.lm(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True,
                   logits_to_keep=1)  # fmt: skip
        h, lp = out.hidden_states[-1][:, -1].float(), out.logits[:, -1].float().log_softmax(-1)
        if hidden is None:
            hidden = np.zeros((len(prompts), h.shape[-1]), np.float32)
            logp = np.zeros((len(prompts), lp.shape[-1]), np.float32)
        hidden[idx], logp[idx] = h.cpu().numpy(), lp.cpu().numpy()
    if hidden is None:
        return np.zeros((0, hidden_size(policy)), np.float32), None
    return hidden, logp


def last_token_hidden(
    policy: Policy, prompts: list[Prompt], cost: Compute | None = None
) -> np.ndarray:
    """(N, hidden): the policy's last hidden state at each prompt's last token."""
    return _prompt_pass(policy, prompts, cost)[0]


def prefill_features(
    policy: Policy, prompts: list[Prompt], cost: Compute | None = None
) -> np.ndarray:
    """(N, 2 + hidden), from the one forward pass a `hidden` featurizer takes, no decoding: the
    probability of the policy's likeliest first answer token, that distribution's entropy
    over log(vocab), and the last hidden state. The first column is a pass-rate estimate of
    sorts (a policy unsure how to start is unsure of the answer) the PPM starts from."""
    hidden, logp = _prompt_pass(policy, prompts, cost)
    if logp is None:
        return np.zeros((0, 2 + hidden.shape[1]), np.float32)
    p = np.exp(logp)
    entropy = -(p * logp).sum(-1) / np.log(logp.shape[-1])
    return np.concatenate([p.max(-1, keepdims=True), entropy[:, None], hidden], 1)


@torch.no_grad()
def greedy_confidence(
    policy: Policy, prompts: list[Prompt], max_new_tokens: int, cost: Compute | None = None
) -> np.ndarray:
    """(N, 3): the policy's probability of its own greedy answer, its mean and min token log-prob.

    One greedy decode, no reference answer and no verifier: a confident policy gives a group
    that is all the same (all right or all wrong), an unsure one a mixed, informative group.
    `cost` counts its prompt tokens and the tokens it decodes."""
    s = sample(policy.model, policy.tok, [p.text for p in prompts], 1, max_new_tokens, 0.0)
    if cost is not None:
        cost.add_samples(s)
    out = np.zeros((len(prompts), 3), np.float32)
    for i, lp in enumerate(s.logprobs):
        lp = np.asarray(lp or [0.0])
        out[i] = (np.exp(lp.sum()), lp.mean() / 4, lp.min() / 4)
    return out


@torch.no_grad()
def reference_likelihood(
    policy: Policy,
    prompts: list[Prompt],
    temperature: float,
    max_new_tokens: int,
    cost: Compute | None = None,
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
    if cost is not None:
        cost.add(prefilled=sum(length * len(idx) for length, idx in by_len.items()))
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
    """The PPM-sampler settings tuned on the selection bench (docs/selection-benchmark.md):
    128 candidates
    (more, and the fill, by answer format: FORMAT_TUNING), 40 fit steps; each family's prior
    strength fitted to its outcomes, candidates valued by their posterior's expected
    informativeness with hard tilt 2, ranked over all families (not per family), a 5% uniform
    share."""
    return PredictiveArgs(candidate_pool=128, prior_strength=16, fit_steps=40, hard_tilt=2.0,
                          acquisition="expected", prior="fit", stratify="none",
                          uniform_share=0.05)  # fmt: skip


def make_policy_ppm_sampler(
    pool: list[Prompt],
    seed: int,
    policy: Callable[[], Policy],
    features: list[str],
    args: PredictiveArgs,
    temperature: float,
    max_new_tokens: int,
    neighbourhood=None,
    embedder: Featurizer | None = None,
    pseudo_count: float = 0.0,
    zero_shot: bool = True,
    refresh_every: int = 1,
    confidence_tokens: int = 0,
) -> PredictiveSampler:
    """The PPM sampler reading `features` (of `policy()`, called at every scoring, so it can
    return a newer policy each time; call `sampler.ppm.refresh_features()` when it changes).

    `embedder` (default `static_featurizer(features)`) gives the prompt vectors picks are
    spread over and neighbours are found by; `neighbourhood` (default in memory) answers the
    neighbourhood pass rates in that space (the streaming scheduler's reads its Qdrant).
    `pseudo_count`, `zero_shot`, `refresh_every`: the PPM's (PPMArgs); `confidence_tokens`:
    how far the `confidence` featurizer decodes (0: max_new_tokens, the whole answer). What
    scoring reads of the policy is counted in `sampler.compute` (`selection/compute.py`;
    static features cost no policy)."""
    T, n_new = temperature, max_new_tokens
    cost = Compute()
    embedder = embedder or static_featurizer(features)

    def part(name: str):
        inner = getattr(embedder, "inner", None)
        if name == "text":
            return (
                embedder
                if isinstance(inner, TextFeaturizer)
                else CachedFeaturizer(TextFeaturizer())
            )
        if name == "minilm":
            if isinstance(inner, MiniLMFeaturizer):
                return embedder
            return CachedFeaturizer(MiniLMFeaturizer())
        if name == "reference":
            return HiddenStateFeaturizer(
                lambda ps: reference_likelihood(policy(), ps, T, n_new, cost), 3, base=0
            )
        if name == "confidence":
            return HiddenStateFeaturizer(
                lambda ps: greedy_confidence(policy(), ps, confidence_tokens or n_new, cost),
                3,
                base=0,
            )
        if name == "prefill":
            return HiddenStateFeaturizer(lambda ps: prefill_features(policy(), ps, cost),
                                         2 + hidden_size(policy()), base=0)  # fmt: skip
        return HiddenStateFeaturizer(lambda ps: last_token_hidden(policy(), ps, cost),
                                     hidden_size(policy()))  # fmt: skip

    parts = [part(f) for f in features]
    ppm = PromptPredictiveModel(PPMArgs(seed=seed, pseudo_count=pseudo_count, zero_shot=zero_shot,
                                        refresh_every=refresh_every),
                                featurizer=ConcatFeaturizer(parts),
                                neighbourhood=neighbourhood, keys=embedder)  # fmt: skip
    sampler = PredictiveSampler(pool, seed, args=args, ppm=ppm, embeddings=embedder(pool),
                                embedder=embedder)  # fmt: skip
    sampler.compute = cost
    return sampler
