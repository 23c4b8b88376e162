"""PNG curves of a local run: loss per phase, reward, held-out accuracy, policy entropy."""

from __future__ import annotations

from pathlib import Path


def plot_curves(history: list[dict], path: str | Path) -> Path:
    """Write a 2x2 figure from the loop's history rows (dicts with 'phase' and 'step')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pre = [h for h in history if h["phase"] == "pretrain" and "loss" in h]
    val = [h for h in history if h["phase"] == "pretrain" and "val_loss" in h]
    rl = [h for h in history if h["phase"] == "rl" and "reward" in h]
    ev = [h for h in history if "greedy" in h]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    a = ax[0, 0]
    a.plot([h["step"] for h in pre], [h["loss"] for h in pre], lw=0.6, label="pre-train loss")
    a.plot([h["step"] for h in val], [h["val_loss"] for h in val], "o-", label="pre-train val loss")
    if rl:  # the RL surrogate loss lives on another scale: its own axis
        b = a.twinx()
        b.plot([h["step"] for h in rl], [h.get("loss", float("nan")) for h in rl], "g", lw=0.6)
        b.set_ylabel("RL loss", color="g")
    a.set_title("loss per phase"), a.set_xlabel("step"), a.legend()
    a = ax[0, 1]
    a.plot([h["rl_step"] for h in rl], [h["reward"] for h in rl], lw=0.8)
    a.set_title("mean reward per RL step"), a.set_xlabel("RL step")
    a = ax[1, 0]
    a.plot([h["rl_step"] for h in ev], [h["greedy"] for h in ev], "o-", label="greedy")
    a.plot([h["rl_step"] for h in ev], [h["pass1"] for h in ev], "s-", label="pass@1")
    a.set_ylim(0, 1), a.set_title("held-out accuracy"), a.set_xlabel("RL step"), a.legend()
    a = ax[1, 1]
    a.plot([h["rl_step"] for h in rl], [h.get("entropy", float("nan")) for h in rl], lw=0.8)
    a.set_title("policy entropy (nats/token)"), a.set_xlabel("RL step")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
