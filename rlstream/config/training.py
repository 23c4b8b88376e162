"""How it is trained: pre-training (`pretrain.*`) and RL (`rl.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlstream.config.checks import ConfigError, at_least, choice
from rlstream.registry import SETTING_CHECKS


@dataclass
class PretrainConfig:
    batch: int = 128
    """documents per pre-training step"""
    lr: float = 2e-3
    """peak learning rate (AdamW 0.9/0.95, wd 0.1; cosine to a tenth over max_steps)"""
    max_steps: int = 2000
    """cap on pre-training steps (the cosine schedule's length); the plateau may stop earlier"""
    warmup_steps: int = 100
    """linear warmup steps"""
    val_interval: int = 200
    """steps between validation-loss checks"""
    patience: int = 2
    """validation checks without improvement before pre-training is declared converged"""
    min_delta: float = 0.01
    """smallest validation-loss improvement that counts"""

    def __post_init__(self):
        for name in ("batch", "max_steps", "val_interval", "patience"):
            at_least("pretrain", name, getattr(self, name), 1)


@dataclass
class RLConfig:
    algo: str = "grpo"
    """advantage estimator: grpo (group-normalised, no critic) or ppo (value head + GAE)"""
    steps: int = 200
    """RL updates"""
    prompts_per_step: int = 32
    """prompt groups per update (B)"""
    group_size: int = 8
    """completions per prompt (G)"""
    temperature: float = 1.0
    """rollout and pass@1 temperature (old logprobs are tempered: keep 1.0)"""
    max_new_tokens: int = 8
    """longest completion"""
    lr: float | None = None
    """RL learning rate, cosine-decayed to lr x min_lr_ratio over `steps`; unset, it follows
    algo (see `learning_rate`)"""
    min_lr_ratio: float = 0.1
    """final learning rate as a share of lr"""
    kl_coef: float = 0.0
    """weight of the KL(pi || ref) penalty (k3) to the frozen pre-trained reference"""
    clip: float = 0.2
    """PPO ratio clip (also bounds the importance weights of stale experience)"""
    vf_coef: float = 0.5
    """value-loss weight (ppo)"""
    ent_coef: float = 0.01
    """entropy-bonus weight (ppo; grpo uses none)"""
    gamma: float = 0.99
    """GAE discount (ppo)"""
    lam: float = 0.95
    """GAE lambda (ppo)"""
    update_epochs: int | None = None
    """passes over each batch (default: 1 for grpo, 10 for ppo as in the design notes)"""
    num_minibatches: int | None = None
    """minibatches per epoch (default: 1 for grpo, 4 for ppo)"""
    max_policy_lag: int = 4
    """groups produced more than this many versions before the update are dropped (counted)"""
    max_grad_norm: float = 1.0
    """gradient clipping norm (pre-training and RL)"""
    hybrid: bool = False
    """mix pre-training loss into RL updates; verified rollouts feed the corpus it reads"""
    hybrid_ratio: float = 0.3
    """share of hybrid compute spent on pre-training loss (0.3 = RL:LM 7:3)"""
    lm_coef: float = 1.0
    """weight of the pre-training loss in hybrid updates"""
    reward_rules: str | None = None
    """JSON reward-rules file (default: each prompt's verifier, 1 or 0)"""
    reward_fn: str | None = None
    """your reward function, TRL's shape: module:function or path/file.py:function, called as
    fn(completions, **columns) -> list[float] (answer, text, task, prompt_id, ... one per row)"""
    verifier_timeout_s: float = 10.0
    """longest a verifier or reward function may take on one group; one that raises or runs
    over gives the group reward 0 and a dead letter with the reason"""
    filter_zero_variance: bool = False
    """drop groups whose rewards are all equal instead of training on them (DAPO's dynamic
    sampling; dropped groups count as consumed, the streaming scheduler refills them)"""
    filter_max_rounds: int = 8
    """the filter's cap: after filter_max_rounds x prompts_per_step dropped groups in one
    batch, zero-variance groups fill the rest (a pool with nothing to learn must not stall)"""

    def __post_init__(self):
        choice("rl", "algo", self.algo, ("grpo", "ppo"))
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens"):
            at_least("rl", name, getattr(self, name), 1)
        at_least("rl", "update_epochs", self.update_epochs, 1)
        at_least("rl", "num_minibatches", self.num_minibatches, 1)
        at_least("rl", "max_policy_lag", self.max_policy_lag, 0)
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"rl.lr: {self.lr!r} must be > 0 (or unset: it follows rl.algo)")
        if self.algo == "grpo" and self.group_size < 2:
            raise ConfigError("rl.group_size: grpo needs >= 2 (advantages are relative in a group)")
        if not 0 <= self.hybrid_ratio < 1:
            raise ConfigError(f"rl.hybrid_ratio: {self.hybrid_ratio!r} must be in [0, 1)")
        if self.minibatches > self.prompts_per_step * self.group_size:
            raise ConfigError("rl.num_minibatches: more minibatches than rollouts per step")
        if self.reward_rules is not None and not Path(self.reward_rules).is_file():
            raise ConfigError(f"rl.reward_rules: no such file {self.reward_rules!r}")
        if self.reward_fn is not None:
            if self.reward_rules is not None:
                raise ConfigError("rl.reward_fn: give it or rl.reward_rules, not both")
            try:  # the rewards module owns what a reward function is (SETTING_CHECKS)
                SETTING_CHECKS.lookup("rl.reward_fn")(self.reward_fn)
            except ValueError as exc:
                raise ConfigError(f"rl.reward_fn: {exc}") from None
        if not self.verifier_timeout_s > 0:
            raise ConfigError(f"rl.verifier_timeout_s: {self.verifier_timeout_s!r} must be > 0")

    @property
    def learning_rate(self) -> float:
        """lr, or the algorithm's default: 3e-4 for GRPO (one optimizer step per batch; at 1e-4
        seed 1 of the main job settled on a wrong borrow rule and stayed at 90.6%), 1e-4 for PPO
        (epochs x minibatches = 40 steps per batch; at 3e-4 it collapses)."""
        return self.lr or (1e-4 if self.algo == "ppo" else 3e-4)

    @property
    def epochs(self) -> int:
        """update_epochs, or the algorithm's default (left unset, it follows rl.algo)."""
        return self.update_epochs or (10 if self.algo == "ppo" else 1)

    @property
    def minibatches(self) -> int:
        """num_minibatches, or the algorithm's default."""
        return self.num_minibatches or (4 if self.algo == "ppo" else 1)
