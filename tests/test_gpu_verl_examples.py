"""On a GPU host: verl's GSM8K quickstart, as its users write it, through `train --verl-example`.

`python3 -m pytest -m gpu tests/test_gpu_verl_examples.py` on one H100 or H200 (about 5 minutes:
a synthetic Qwen2.5-0.5B checkpoint, vLLM's start, two PPO steps with a critic). It shows the
mapped job runs on verl 0.9.1 (torch's variable-length attention where verl would ask for
flash-attn, the embedded dataset and rule reward) and that its wandb-style logger became a
TensorBoard event file in the run folder. CPU CI skips it (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_the_quickstart_trains_as_mapped(root: Path, tmp_path: Path) -> None:
    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    run = Path(keep) / "qs-ppo" if keep else tmp_path / "run"
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    cmd = [sys.executable, "-m", "verl_recipes.cli", "train", "--verl-example", "gsm8k-quickstart", "--steps", "2"]
    proc = subprocess.run([*cmd, "--run-dir", str(run), "--quiet"], env=env, timeout=1200)
    assert proc.returncode == 0, f"verl failed; see {run}/train.log"
    steps = [json.loads(line) for line in (run / "verl_metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) >= 2
    assert list((run / "tensorboard").rglob("events.out.tfevents.*")), "no TensorBoard event file in the run folder"
    assert (run / "summary.json").is_file()
