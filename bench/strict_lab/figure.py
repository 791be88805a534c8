"""The figure: each series per step, each arm's mean over its seeds with the band from the lowest to the highest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strict_lab.analysis import SERIES, arm_bands

COLOURS = {"strict": "tab:blue", "lenient": "tab:red"}


def plot(arms: Mapping[str, Sequence[dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), sharex=True)
    for ax, (key, label) in zip(axes.flat, SERIES):
        for arm, runs in arms.items():
            steps, means, lows, highs = arm_bands(runs, key)
            colour = COLOURS.get(arm)
            ax.plot(steps, means, color=colour, label=f"{arm} ({len(runs)} seeds)")
            ax.fill_between(steps, lows, highs, color=colour, alpha=0.2, linewidth=0)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("GRPO step")
    axes[0][0].legend()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
