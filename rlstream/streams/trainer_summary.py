"""The stream trainer's figures at the end of a run: accuracy before and after RL, steps, groups
trained, skipped and refused, the corpus fed back, its idle share, policy lag and checkpoint sizes
(the launcher's summary and report read them)."""

from __future__ import annotations


def summarize(trainer, final: dict) -> dict:
    """The run's trainer figures from a `StreamTrainer` after its last step; `final`: its last
    evaluation."""
    c, st, pe = trainer.counters, trainer.state, trainer.pretrain_eval
    wall = c.get("wall_rl_s", 0.0)
    return {
        "algo": trainer.cfg.rl.algo,
        "hybrid": trainer.cfg.rl.hybrid,
        "pretrain_accuracy": pe.get("greedy"),
        "pretrain_pass1": pe.get("pass1"),
        "final_accuracy": final["greedy"],
        "final_pass1": final.get("pass1"),
        "final_by_task": final.get("greedy_by_task"),
        "pretrain_steps": st.pre_step,
        "rl_steps": st.rl_step,
        "experience_trained": int(c["experience_trained"]),
        "duplicates_skipped": int(c["duplicates_skipped"]),
        "duplicates_trained": int(c["duplicates_trained"]),
        "untrainable_rows": int(c["untrainable_rows"]),
        "dedup_window_ids": int(c["dedup_window_ids"]),
        "stale_dropped": int(c["stale_dropped"]),
        "groups_consumed": int(c["groups_consumed"]),
        "zero_variance_share": round(c["zero_variance_groups"] / c["groups_consumed"], 4)
        if c["groups_consumed"]
        else None,
        "filtered_groups": int(c["filtered_groups"]),
        "env_failed_groups": int(c["env_failed_groups"]),  # an episode's environment failed
        "dataset": trainer.cfg.data.dataset,
        "eval_prompts": len(trainer.eval_set),
        "refused": trainer.refused,
        "corpus_fed": int(c["corpus_fed"]),
        "corpus_consumed_during_rl": int(c["corpus_consumed"]),
        "trainer_idle_share": round(c["idle_s"] / wall, 4) if wall else None,
        "policy_lag_histogram": {
            int(k[4:]): int(v) for k, v in sorted(c.items()) if k.startswith("lag_")
        },
        "checkpoint_sizes": [list(p) for p in trainer.checkpoint_sizes],
    }
