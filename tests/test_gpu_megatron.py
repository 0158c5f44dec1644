"""On a GPU host: rerun the 2-layer run of recipe 70b-3d (Megatron, TP1 x PP1, one GPU) and check it.

`python3 -m pytest -m gpu tests/test_gpu_megatron.py` on one H200, after the Megatron wheels are
installed (gpu/megatron-notes.md). The run is the `70b-3d/h200x1-ppo-tp1pp1-l2` line of gpu/campaigns/70b-tp1.txt,
read from that file so the test and the campaign cannot drift apart: Llama-2-70B widths with 2
layers, PPO with the critic, vLLM rollout, 3 steps (about 10 minutes cold: the full-width checkpoint,
two Megatron models and vLLM start before the first step).

Once the run's bounds are committed (`verl-recipes check-bounds 70b-3d --write-bounds RUN --out
recipes/70b-3d/expected/h200x1-ppo-tp1pp1-l2.yaml`) the rerun's memory must fall inside them
(`--memory-only`: its speed is printed against its band, not judged). Until then it must
finish its 3 steps and leave an NVML peak for every phase a PPO step with a critic has, which is
what the depth fit (`verl-recipes plan --from-layers`) reads. CPU CI skips it (tests/conftest.py)
and runs only the check that the rerun is the campaign's line.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "gpu" / "campaigns" / "70b-tp1.txt"
LINE = "70b-3d/h200x1-ppo-tp1pp1-l2"
BOUNDS = "expected/h200x1-ppo-tp1pp1-l2.yaml"
#: phases of one PPO step with a critic on verl's Megatron engine, as the report names them.
PHASES = ("gen", "old_log_prob", "values", "update_critic", "update_actor", "update_weights")


def campaign_line(name: str = LINE, campaign: Path = CAMPAIGN) -> tuple[int, list[str]]:
    """(time limit in s, `verl-recipes train` arguments) of one line of a committed campaign."""
    for raw in campaign.read_text().splitlines():
        if raw.startswith(f"{name}|"):
            _, limit, _, what = raw.split("|", 3)
            return int(limit), shlex.split(what)
    raise AssertionError(f"{campaign}: no line {name}")


def train_line(root: Path, tmp_path: Path, name: str, limit: int, args: list[str]) -> Path:
    """Run a campaign line's `train` and check what every Megatron PPO run must leave: exit 0, 3
    steps logged and an NVML peak for every phase. The run folder is returned for further checks;
    under gpu/campaign.sh (VERL_RECIPES_GPU_RUNS_DIR) it is kept as a result."""
    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    run = Path(keep) / name if keep else tmp_path / "run"
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    cli = [sys.executable, "-m", "verl_recipes.cli"]
    proc = subprocess.run([*cli, "train", *args, "--run-dir", str(run), "--quiet"], env=env, timeout=limit)
    assert proc.returncode == 0, f"verl failed; see {run}/train.log"
    steps = [line for line in (run / "verl_metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) >= 3, f"{len(steps)} step(s) logged; see {run}/train.log"
    summary = json.loads((run / "summary.json").read_text())
    missing = [ph for ph in PHASES if not (summary.get("phases") or {}).get(ph, {}).get("gpu")]
    assert not missing, f"no NVML peak for {missing} in {run}/summary.json"
    return run


def test_the_rerun_is_the_campaigns_two_layer_run() -> None:
    """Runs on CPU too: the GPU test below reruns exactly the committed campaign's 2-layer line."""
    limit, args = campaign_line()
    assert args[0] == "70b-3d" and 600 <= limit <= 1800
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags == {"--variant": "tp1pp1", "--gpus": "1", "--layers": "2", "--steps": "3"}, args


@pytest.mark.gpu
def test_70b_two_layers_tp1_runs_three_steps(root: Path, tmp_path: Path) -> None:
    limit, args = campaign_line()
    run = train_line(root, tmp_path, LINE, limit, args)
    if (root / "recipes" / "70b-3d" / BOUNDS).is_file():
        env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
        cmd = [
            sys.executable,
            "-m",
            "verl_recipes.cli",
            "check-bounds",
            "70b-3d",
            "--run",
            str(run),
            "--expected",
            BOUNDS,
            "--memory-only",
        ]
        assert subprocess.run(cmd, env=env).returncode == 0
