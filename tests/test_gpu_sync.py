"""On a GPU host: the weight sync to vLLM really carries the trained adapter.

A sync that sends the base weights without the adapter, or nothing at all, passes every check on
a random model whose LoRA B is still zero. So the actor's LoRA B starts non-zero
(`verl_recipes.worker.sync_probe`), and one run measures both sides: steps 1 and 3 sample from a
correctly synced vLLM, step 2 from one whose sync (the one at the end of step 1) deliberately
dropped the adapter. verl logs how far vLLM's rollout log-probs are from the actor's recomputed
ones every step (``rollout_corr/kl``: the per-token KL between the two); the synced steps must be
within the tolerance, and the control step must be far outside it, or the check proves nothing.

Tolerance: a synced step's KL at most a quarter of the control step's, and the control's at least
0.05 nats per token (bf16 numerics alone leave ~0.11-0.13 on the random 7B model with a zero
adapter, `h200x1-ppo-fast`). Measured on one H200 (`recipes/7b-lora/results/h200x1-ppo-l4-sync-check`):
0.060 and 0.071 synced, 1.657 for the control.

`python3 -m pytest -m gpu tests/test_gpu_sync.py` (7B widths, 4 layers, about 7 minutes on a cold host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

LORA_B_STD = "0.15"  # scaling 2 x sqrt(64) x 0.009 (peft's A init) x 0.15: ~0.02, the base weights' std
RATIO = 4.0
CONTROL_MIN_KL = 0.05


def test_synced_rollout_matches_the_actor_and_the_dropped_adapter_does_not(root: Path, tmp_path: Path) -> None:
    from verl_recipes.worker import sync_probe

    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    run = Path(keep) / "7b-lora-L4-sync-probe" if keep else tmp_path / "run"
    env = {
        **os.environ,
        "VERL_RECIPES_ROOT": str(root),
        sync_probe.ENV_LORA_B_STD: LORA_B_STD,
        sync_probe.ENV_DROP_SYNCS: "1",
    }
    cmd = [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--layers", "4", "--steps", "3"]
    proc = subprocess.run([*cmd, "--run-dir", str(run), "--quiet"], env=env, timeout=1200)
    assert proc.returncode == 0, f"verl failed; see {run}/train.log"
    steps = {}
    for line in (run / "verl_metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        data = rec.get("data", rec)
        steps[int(rec.get("step", data.get("step", 0)))] = data
    kl = {s: float(steps[s]["rollout_corr/kl"]) for s in (1, 2, 3)}
    (run / "sync-check.json").write_text(
        json.dumps({"kl": kl, "ratio": RATIO, "control_min_kl": CONTROL_MIN_KL, "lora_b_std": LORA_B_STD}) + "\n"
    )
    assert kl[2] >= CONTROL_MIN_KL, f"the control step is not told apart: {kl}"
    assert kl[1] * RATIO <= kl[2] and kl[3] * RATIO <= kl[2], f"synced steps not within tolerance: {kl}"
