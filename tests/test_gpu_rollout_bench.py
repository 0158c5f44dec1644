"""On a GPU host: `verl-recipes rollout-bench` on 7b-lora and its GRPO variant, and its record.

`python3 -m pytest -m gpu tests/test_gpu_rollout_bench.py` on one H200 (the synthetic 7B
checkpoint is made first where missing; vLLM's start-up and CUDA graphs come before the calls).
gpu/campaign.sh sets VERL_RECIPES_GPU_RUNS_DIR so the records are kept beside the campaign's runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


# (variants, prompts a step, answers per prompt): the default PPO batch, the grpo variant's 2 x 4
# and the realistic GRPO batch of 8 x 8.
@pytest.mark.parametrize(
    ("variant", "batch", "n"),
    [([], 8, 1), (["--variant", "grpo"], 2, 4), (["--variant", "grpo", "--variant", "8x8"], 8, 8)],
    ids=["ppo", "grpo", "grpo-8x8"],
)
def test_rollout_bench_records_vllm_alone_on_a_steps_work(
    root: Path, tmp_path: Path, variant: list[str], batch: int, n: int
) -> None:
    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    name = "-".join(["rollout-bench-7b-lora", *variant[1::2]]) + ".json"
    out = Path(keep) / name if keep else tmp_path / name
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    cmd = [sys.executable, "-m", "verl_recipes.cli", "rollout-bench", "7b-lora", *variant, "--calls", "2"]
    proc = subprocess.run([*cmd, "--out", str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vLLM alone: " in proc.stdout and "(2 calls)" in proc.stdout
    rec = json.loads(out.read_text())
    assert rec["recipe"] == "7b-lora" and rec["provenance"]["packages"]["vllm"]
    assert rec["engine_args"]["gpu_memory_utilization"] == 0.3 and rec["engine_args"]["load_format"] == "dummy"
    assert rec["sampling"]["requests"] == len(rec["prompt_tokens"]) == batch * n
    assert rec["sampling"]["max_tokens"] == 512
    assert len(rec["calls_s"]) == 2 and all(s > 0 for s in rec["calls_s"])
    assert min(rec["calls_s"]) <= rec["median_s"] <= max(rec["calls_s"])
    assert len(rec["generated_tokens"]) == 2 and all(0 < g <= batch * n * 512 for g in rec["generated_tokens"])
    assert 0 < rec["decode_ms_per_step"] < 1000 * rec["median_s"]
