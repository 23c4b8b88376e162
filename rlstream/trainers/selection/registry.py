"""The selection-sampler registry: name -> class; a duplicate name is an error.

Every registered class is built as `cls(pool, seed, args=None, **kwargs)`. `build_sampler` is
how every loop (in-process, streaming scheduler, selection bench) gets its sampler from a
Config, the PPM sampler's policy featurizers included.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlstream.registry import SELECTION_SAMPLERS
from rlstream.trainers.envs import Prompt


def make_selection_sampler(name: str, pool: list[Prompt], seed: int = 0, **kwargs: Any):
    """Build a registered sampler; unknown names list the known ones."""
    return SELECTION_SAMPLERS.lookup(name)(pool, seed, **kwargs)


def split_arm(name: str, default_features: str) -> tuple[str, list[str]]:
    """A sampler spec and its PPM featurizers: 'ppm:confidence' -> ('ppm', ['confidence']);
    a plain name takes `default_features`. Only the PPM sampler takes featurizers."""
    from rlstream.config.selection import check_features

    base, _, feats = name.partition(":")
    if feats and base != "ppm":
        raise ValueError(f"sampler {name!r}: only ppm takes featurizers (ppm:<featurizers>)")
    return base, check_features(feats or default_features)


def build_sampler(
    cfg,
    pool: list[Prompt],
    policy,
    name: str | None = None,
    ppm_args=None,
    neighbourhood=None,
    embedder=None,
):
    """The sampler a loop uses: `name` (default cfg.selection.sampler, `ppm:<featurizers>`
    allowed) over `pool`, seeded by cfg.seed. The PPM sampler reads `policy()` (a callable, so
    the loop can hand it the newest policy) with cfg.ppm_feature_spec(); `neighbourhood`
    and `embedder` as `make_policy_ppm_sampler` takes them. With selection.curriculum it
    chooses among the open difficulty levels only (`Curriculum`)."""
    sel = cfg.selection
    if sel.curriculum > 0:
        from rlstream.trainers.selection.curriculum import Curriculum

        def make(open_pool: list[Prompt]):
            return _build(cfg, open_pool, policy, name, ppm_args, neighbourhood, embedder)

        return Curriculum(make, pool, sel.curriculum, sel.curriculum_window)
    return _build(cfg, pool, policy, name, ppm_args, neighbourhood, embedder)


def _build(cfg, pool, policy, name, ppm_args, neighbourhood, embedder):
    from rlstream.trainers.selection.policy_features import (
        make_policy_ppm_sampler,
        reads_policy,
        tuned_args,
    )

    base, features = split_arm(name or cfg.selection.sampler, cfg.ppm_feature_spec())
    if base != "ppm":
        sampler = make_selection_sampler(base, pool, cfg.seed)
        sampler.reads_policy = False
        return sampler
    tuning = format_tuning(cfg)
    sel = cfg.selection
    shortlist_rounds = tuning["refresh_every"] if tuning["shortlist"] else 0
    args = replace(ppm_args or tuned_args(), candidate_pool=sel.ppm_candidates,
                   candidate_max=tuning["candidate_max"], fill=tuning["fill"],
                   explore_share=tuning["explore_share"], hard_tilt=sel.ppm_hard_tilt,
                   prior_strength=sel.ppm_prior_strength, acquisition=sel.ppm_acquisition,
                   prior=sel.ppm_prior,
                   shortlist_rounds=shortlist_rounds)  # fmt: skip
    sampler = make_policy_ppm_sampler(pool, cfg.seed, policy, features, args,
                                      cfg.rl.temperature, cfg.rl.max_new_tokens,
                                      neighbourhood=neighbourhood, embedder=embedder,
                                      pseudo_count=tuning["pseudo_count"],
                                      zero_shot=sel.ppm_zero_shot,
                                      refresh_every=tuning["refresh_every"],
                                      confidence_tokens=tuning["confidence_tokens"])  # fmt: skip
    sampler.reads_policy = reads_policy(features)
    return sampler


def format_tuning(cfg) -> dict:
    """The PPM sampler's settings tuned by answer format (FORMAT_TUNING), each
    replaced where cfg.selection sets it: candidate_max, fill, explore_share, pseudo_count,
    confidence_tokens, shortlist, refresh_every."""
    from rlstream.config.selection import FORMAT_TUNING

    sel, auto = cfg.selection, FORMAT_TUNING[cfg.data.format]
    given = {
        "candidate_max": sel.ppm_candidates_max or None,
        "fill": None if sel.ppm_fill == "auto" else sel.ppm_fill,
        "explore_share": sel.ppm_explore_share,
        "pseudo_count": sel.ppm_pseudo_count,
        "confidence_tokens": sel.ppm_confidence_tokens or None,
        "shortlist": sel.ppm_shortlist,
        "refresh_every": sel.ppm_refresh_every or None,
    }
    return {k: auto[k] if v is None else v for k, v in given.items()}


def policy_moved(sampler) -> None:
    """Tell a sampler the policy it reads was updated (its cached policy features are stale)."""
    if getattr(sampler, "reads_policy", False):
        sampler.ppm.refresh_features()
