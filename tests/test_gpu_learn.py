"""On a GPU host: the recipe's own loop learns, so its speed is the speed of a loop that trains.

The arithmetic reward stays 0 on a random model, so no speed run shows learning. The `learn`
variant of 7b-lora runs the same trainer path (GRPO, LoRA rank 64, the merged sync to vLLM) on a
synthetic model of the bundled Qwen2-0.5B widths, 4 layers, with the text reward
(`verl_recipes.workload.reward.compute_text_score`), which a random model scores on from its first
step: twice, at the variant's learning rate and at 0 (the control). The learning run's mean reward
must rise by at least half its headroom within its steps, and the control's stay within a tenth
(verl_recipes.measure.learning); both curves are written beside the runs as learning-curve.json
and learning-curve.png.

`python3 -m pytest -m gpu tests/test_gpu_learn.py` (about 6 minutes a run on a warm host).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

STEPS = 60
TRAIN = ["train", "7b-lora", "--variant", "learn", "--arch", "qwen2-0.5b", "--layers", "4", "--steps", str(STEPS)]


def _gpu() -> str:
    import torch
    from verl_recipes.recipe.run_names import gpu_family

    return gpu_family(torch.cuda.get_device_name(0))


@pytest.mark.parametrize("lr", [None, "0.001"], ids=["variant-lr", "lr0.001"])
def test_the_loop_learns_the_text_reward_and_the_control_does_not(root: Path, tmp_path: Path, lr: str | None) -> None:
    """At the variant's learning rate, or (`-k lr0.001`, the campaign's second line, run where the
    first fails) five times it."""
    from verl_recipes.measure.learning import read_curve, write_curves

    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    base = Path(keep) if keep else tmp_path
    name = f"{_gpu()}x1-grpo-learn-l4-qwen2"
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    lr_set = ["--set", f"actor_rollout_ref.actor.optim.lr={lr}"] if lr else []
    runs = {
        "learning": (base / (f"{name}-lr{lr}" if lr else name), lr_set),
        "control, lr 0": (base / f"{name}-lr0", ["--set", "actor_rollout_ref.actor.optim.lr=0"]),
    }
    for run_dir, extra in runs.values():
        cmd = [sys.executable, "-m", "verl_recipes.cli", *TRAIN, *extra, "--run-dir", str(run_dir), "--quiet"]
        proc = subprocess.run(cmd, env=env, timeout=900)
        assert proc.returncode == 0, f"verl failed; see {run_dir}/train.log"
    learning, control = (read_curve(run_dir, label) for label, (run_dir, _) in runs.items())
    write_curves([learning, control], base / "learning-curve")
    assert learning.learned(), f"the reward rose {learning.rise:.0%} of its headroom: {learning.rewards}"
    assert control.flat(), f"the control moved {control.rise:.0%} of its headroom: {control.rewards}"
