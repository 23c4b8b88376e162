"""Which reference-free features tell prompts of one task family apart?

The selection bench's reference-free PPM separates families (Pearson r 0.81 on the mixed
chain-of-thought pool) but wastes 0.76x of uniform's rollouts: within a family it sees little.
This probe asks which features carry that signal, with the supervision taken out of the
question: the pass rates of N pool prompts under the bench's pre-trained policy (k samples
each), a ridge regression per feature set fitted on the first n prompts' k'-sample rates (the
noisy targets a live PPM sees: a group of 8), Pearson r on the last quarter, overall and within
families (each family's mean removed from predictions and rates). A last line asks what the
greedy answer's probability says with nothing fitted (the PPM's zero-shot prior): its r, and the
zero-variance share of a first batch picked by it.

    python benchmarks/ppm_features_probe.py --summary benchmarks/results/selection-cot-mix.json

reads the run settings from a `bench selection --summary` file, uses its cached pre-trained
checkpoint (pre-trains it otherwise) and prints one table; `--out FILE.json` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rlstream.config import Config, from_dict
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.envs.cot import in_format
from rlstream.trainers.policy import policy_from_bytes
from rlstream.trainers.selection import policy_features as PF
from rlstream.trainers.selection.features import MiniLMFeaturizer
from rlstream.trainers.selection.loop import evaluate_heldout
from rlstream.trainers.selection.policies import pretrained_policy


@torch.no_grad()
def pooled_hidden(policy, prompts) -> np.ndarray:
    """(N, layers x hidden): every layer's hidden state averaged over the prompt's tokens."""
    m, tok = policy.model, policy.tok
    enc = tok.encode_prompts([p.text for p in prompts])
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(enc):
        by_len[min(len(e), m.block_size)].append(i)
    out = None
    for length, idx in by_len.items():
        x = torch.tensor([enc[i][-length:] for i in idx])
        hs = m.lm(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True)
        v = torch.cat([h.mean(1) for h in hs.hidden_states[1:]], -1).numpy()
        out = np.zeros((len(prompts), v.shape[1]), np.float32) if out is None else out
        out[idx] = v
    return out


def ridge_predict(x_tr, y_tr, x_te, alphas=np.logspace(-2, 4, 13)) -> np.ndarray:
    """Standardised ridge, alpha chosen on the training set's last fifth."""
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    a, b = (x_tr - mu) / sd, (x_te - mu) / sd
    cut = int(0.8 * len(a))

    def fit(x, y, alpha):
        xm, ym = x.mean(0), y.mean()
        w = np.linalg.solve(
            (x - xm).T @ (x - xm) + alpha * np.eye(x.shape[1]), (x - xm).T @ (y - ym)
        )
        return lambda z: (z - xm) @ w + ym

    err = [np.mean((fit(a[:cut], y_tr[:cut], al)(a[cut:]) - y_tr[cut:]) ** 2) for al in alphas]
    return fit(a, y_tr, alphas[int(np.argmin(err))])(b)


def within_r(pred, rate, task) -> float:
    p, o = pred.astype(float).copy(), rate.astype(float).copy()
    for t in np.unique(task):
        m = task == t
        p[m] -= p[m].mean()
        o[m] -= o[m].mean()
    return float(np.corrcoef(p, o)[0, 1])


def first_batch_waste(score, rate, group, rng, candidates=128, batch=32, draws=2000) -> float:
    """Expected zero-variance share of a first batch: the `batch` of `candidates` random pool
    prompts that score highest, groups of `group` at the measured rates (mean of `draws`)."""
    zero = rate**group + (1 - rate) ** group
    out = []
    for _ in range(draws):
        c = rng.choice(len(rate), candidates, replace=False)
        out.append(zero[c[np.argsort(-score[c], kind="stable")[:batch]]].mean())
    return float(np.mean(out))


def zero_shot(conf: np.ndarray, rate: np.ndarray, task: np.ndarray, group: int) -> dict:
    """What the greedy answer's probability says with nothing fitted (the PPM's zero-shot prior,
    `PPMArgs.zero_shot`): its r with the pass rates, and a first batch picked closest to 0.5
    against one picked at random and one picked by the rates themselves."""
    p, rng = conf[:, 0], np.random.default_rng(1)
    informative = lambda q: 1 - q**group - (1 - q) ** group  # noqa: E731
    return {
        "r": float(np.corrcoef(p, rate)[0, 1]),
        "within_r": within_r(p, rate, task),
        "first_batch_waste": {
            "random": first_batch_waste(rng.random(len(rate)), rate, group, rng),
            "zero_shot": first_batch_waste(informative(p), rate, group, rng),
            "oracle": first_batch_waste(informative(rate), rate, group, rng),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summary", required=True, help="a `bench selection --summary` JSON")
    ap.add_argument("--prompts", type=int, default=1600)
    ap.add_argument("--samples", type=int, default=16, help="samples per prompt (the truth)")
    ap.add_argument("--group", type=int, default=8, help="samples per training target")
    ap.add_argument("--train", default="100,300,1000", help="training set sizes")
    ap.add_argument("--cache-dir", default="~/.cache/rlstream/selection")
    ap.add_argument("--out", help="write the figures here as JSON")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = from_dict(Config, json.loads(Path(a.summary).read_text())["config"]["train"])
    blob, _ = pretrained_policy(cfg, Path(a.cache_dir).expanduser(), 1)
    policy = policy_from_bytes(blob)
    mix, n = TaskMix.parse(cfg.data.tasks), a.prompts
    prompts = [in_format(p, cfg.data.format) for p in sample_prompts(mix, n, "train", 7)]
    task = np.array([p.task for p in prompts])
    t0, rates = time.time(), []
    for i in range(0, n, 200):
        rates.append(evaluate_heldout(policy, prompts[i : i + 200], a.samples, cfg, 11 + i)[1])
        print(f"[{time.time() - t0:5.0f} s] pass rates {i + len(rates[-1])}/{n}", flush=True)
    rate = np.concatenate(rates)
    feats, cost = {}, {}
    for name, fn in (
        ("hidden (last layer, last token)", lambda: PF.last_token_hidden(policy, prompts)),
        ("hidden (all layers, token mean)", lambda: pooled_hidden(policy, prompts)),
        ("minilm", lambda: MiniLMFeaturizer()(prompts)),
        ("confidence (one greedy decode)",
         lambda: PF.greedy_confidence(policy, prompts, cfg.rl.max_new_tokens)),
    ):  # fmt: skip
        t = time.time()
        feats[name] = fn()
        cost[name] = (time.time() - t) / n * 1000
    families = np.stack([(task == t).astype(np.float32) for t in np.unique(task)], 1)
    feats["family labels only"] = families
    cost["family labels only"] = 0.0
    rng = np.random.default_rng(0)
    noisy = rng.binomial(a.group, rate) / a.group
    test = np.arange(3 * n // 4, n)
    sizes = [int(s) for s in a.train.split(",")]
    means = ", ".join(f"{t} {rate[task == t].mean():.2f}" for t in np.unique(task))
    print(f"\n{n} prompts (mean pass rate {means}); ridge on {a.group}-sample targets, r on the "
          f"last {len(test)} against {a.samples}-sample rates: overall / within")  # fmt: skip
    print(f"{'features':34s} {'ms/prompt':>9s} " + " ".join(f"{'n=' + str(s):>13s}" for s in sizes))
    figures = {"prompts": n, "samples": a.samples, "group": a.group, "features": {}}
    for name, x in feats.items():
        row = {}
        for s in sizes:
            pred = ridge_predict(x[:s], noisy[:s], x[test])
            row[s] = (
                float(np.corrcoef(pred, rate[test])[0, 1]),
                within_r(pred, rate[test], task[test]),
            )
        figures["features"][name] = {"ms_per_prompt": cost[name], "r": row}
        print(
            f"{name:34s} {cost[name]:9.1f} "
            + " ".join(f"{o:6.2f}/{w:5.2f}" for o, w in row.values())
        )
    zs = figures["zero_shot"] = zero_shot(
        feats["confidence (one greedy decode)"], rate, task, a.group
    )
    w = zs["first_batch_waste"]
    print(
        f"\nzero-shot (the greedy answer's probability, nothing fitted): r {zs['r']:.2f} / "
        f"within {zs['within_r']:.2f}; a first batch of 32 of 128 candidates wastes "
        f"{w['zero_shot']:.2f} picked by it, {w['random']:.2f} at random, {w['oracle']:.2f} "
        "picked by the true rates"
    )
    if a.out:
        Path(a.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    sys.exit(main())
