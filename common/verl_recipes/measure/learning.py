"""Whether a run's loop learns: its mean reward per step, the rise against the headroom, the curve.

A speed figure is only worth having from a loop that trains, and a random model scores 0 on the
arithmetic reward, so the learning check (`tests/test_gpu_learn.py`, the `learn` variant of
7b-lora with `verl_recipes.workload.reward.compute_text_score`) runs the same trainer path twice,
once with the recipe's learning rate and once with 0, and holds the two curves to this:

    start    = mean reward of the first `window` steps
    end      = mean reward of the last `window` steps
    headroom = best - start            (the reward's ceiling, 1.0 for a share)
    learned  = end - start >= RISE x headroom          (RISE 0.5: half the headroom)
    flat     = |end - start| <= FLAT x headroom, for the control (FLAT 0.1)

The reward per step is verl's own `critic/score/mean` (the mean sequence score of the step's
batch), read from the run folder's `verl_metrics.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError, rundir

SCORE = "critic/score/mean"
RISE = 0.5
FLAT = 0.1


@dataclass(frozen=True)
class Curve:
    label: str
    rewards: list[float]  # step 1, 2, ...
    window: int = 3
    best: float = 1.0

    @property
    def start(self) -> float:
        return sum(self.rewards[: self.window]) / self.window

    @property
    def end(self) -> float:
        return sum(self.rewards[-self.window :]) / self.window

    @property
    def headroom(self) -> float:
        return self.best - self.start

    @property
    def rise(self) -> float:
        """The rise as a share of the headroom."""
        return (self.end - self.start) / self.headroom if self.headroom > 0 else 0.0

    def learned(self) -> bool:
        return self.rise >= RISE

    def flat(self) -> bool:
        return abs(self.rise) <= FLAT


def read_curve(run_dir: Path, label: str, window: int = 3) -> Curve:
    """The run's mean reward per step; every step from 1 on must have logged it."""
    path = run_dir / rundir.VERL_METRICS
    if not path.is_file():
        raise RecipeError(f"{run_dir}: no {rundir.VERL_METRICS}; did the run reach its first step?")
    by_step: dict[int, float] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        data = rec.get("data", rec)
        if SCORE in data:
            by_step[int(rec.get("step", data.get("step", 0)))] = float(data[SCORE])
    steps = sorted(by_step)
    if len(steps) < 2 * window or steps != list(range(1, len(steps) + 1)):
        raise RecipeError(f"{path}: {SCORE} for steps {steps}; need steps 1..N, N >= {2 * window}, none missing")
    return Curve(label, [by_step[s] for s in steps], window)


def write_curves(curves: list[Curve], out: Path) -> None:
    """The curves as JSON (`out` with .json) and a PNG (`out` with .png), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = {
        c.label: {
            "rewards": [round(r, 5) for r in c.rewards],
            "start": round(c.start, 5),
            "end": round(c.end, 5),
            "rise_of_headroom": round(c.rise, 4),
        }
        for c in curves
    }
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in curves:
        ax.plot(range(1, len(c.rewards) + 1), c.rewards, label=f"{c.label} (rise {c.rise:.0%} of headroom)")
    ax.axhline(curves[0].start + RISE * curves[0].headroom, color="grey", ls=":", lw=1, label="half the headroom")
    ax.set_xlabel("step")
    ax.set_ylabel(f"mean reward ({SCORE})")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
