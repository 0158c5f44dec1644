"""vllm-pool on CPU: its arguments, its one-line refusal without a GPU, the quickstart's engine and
cases it derives (against verl's composed config and the committed run's own verl_config.yaml),
the round summary and the JSON record it writes. The measurement runs on a GPU host
(gpu/campaigns/vllm-pool.txt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.measure import rollout_bench as rb
from verl_recipes.measure import vllm_pool as vp
from verl_recipes.measure.vllm_pool_worker import GIB, pick

RUN = Path(__file__).parents[1] / "validation/verl-examples/results/gsm8k-quickstart/h100x1-ppo-rank0of1"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "vllm-pool", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.skipif(rb.vllm_available(), reason="this host measures; the CPU path is for hosts without vLLM")
def test_a_cpu_host_and_bad_arguments_are_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    res = _cli("--verl-example", "gsm8k-quickstart", "--out", str(out))
    assert res.returncode == 2 and res.stderr.strip() == f"error: {vp.NO_GPU}", res.stderr[-2000:]
    res = _cli("--verl-example", "gsm8k-quickstart", "--cases", "verl,sideways", "--dry-run")
    assert res.returncode == 2 and res.stderr.strip().startswith("error: --cases verl,sideways: name cases from")
    res = _cli("--verl-example", "gsm8k-quickstart", "--rounds", "0", "--dry-run")
    assert res.returncode == 2 and res.stderr.strip() == "error: --rounds must be at least 1"
    out.write_text("{}")
    res = _cli("--verl-example", "gsm8k-quickstart", "--out", str(out))
    assert res.returncode == 2 and "exists; name a new file" in res.stderr and out.read_text() == "{}"
    assert not res.stdout


def test_the_quickstarts_engine_is_the_runs_and_the_cases_change_one_thing_each() -> None:
    """The engine verl's server starts for the quickstart: the committed run's utilization, batch
    limits and chunked prefill, sleep mode on; each case differs from verl's sampling in its one
    setting."""
    from omegaconf import OmegaConf

    args = vp.argparse.Namespace(recipe=None, verl_example="gsm8k-quickstart", sets=[])
    _, cfg, hf, _ = vp.compose(args)
    engine = rb.engine_args(cfg, hf)
    ran = OmegaConf.load(RUN / "verl_config.yaml").actor_rollout_ref.rollout
    assert engine["enable_sleep_mode"] is True  # RolloutConfig's default; the run's file leaves it to it
    for key in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"):
        assert engine[key] == ran[key], key
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"]) == (256, 8192)
    params = rb.sampling(cfg, [[1] * 100, [2] * 120], engine["max_model_len"])
    verl = vp.case_sampling("verl", params)
    assert verl == params and verl[0]["logprobs"] == 0 and verl[0]["temperature"] == 1.0
    assert [p["logprobs"] for p in vp.case_sampling("nologprobs", params)] == [None, None]
    greedy = vp.case_sampling("greedy", params)
    assert greedy[0]["temperature"] == 0.0 and greedy[0]["logprobs"] == 0
    assert vp.case_sampling("batched", params) == params
    assert vp.arrival_offsets(5, 1.0, "verl") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert vp.arrival_offsets(5, 1.0, "batched") == [0.0] * 5
    with pytest.raises(RecipeError, match="not both"):
        vp.compose(vp.argparse.Namespace(recipe="7b-lora", verl_example="gsm8k-quickstart", sets=[]))


def _stats(reserved: float, allocated: float, retries: int = 0, segments: int = 4) -> dict[str, Any]:
    """One reading as `pool_stats` makes it, from torch's memory_stats keys and a snapshot: a
    default-pool segment of `reserved - 30` GiB beside vLLM's 30 GiB sleep-mode pool."""
    stats = {
        "allocated_bytes.all.current": int(allocated * GIB),
        "reserved_bytes.all.current": int(reserved * GIB),
        "active_bytes.all.current": int(allocated * GIB),
        "inactive_split_bytes.all.current": int((reserved - allocated) * GIB),
        "segment.all.current": segments,
        "num_alloc_retries": retries,
        "num_device_alloc": segments,
    }
    snapshot = [
        {"segment_pool_id": (0, 1), "total_size": 30 * GIB, "allocated_size": 30 * GIB},
        {"segment_pool_id": (0, 0), "total_size": int((reserved - 30) * GIB), "allocated_size": 0},
    ]
    return pick(stats, snapshot, free=int((80 - reserved - 1) * GIB), total=80 * GIB)


def test_a_rounds_summary_and_the_record(tmp_path: Path) -> None:
    rec = vp.Recorder()
    one = _stats(30.5, 30.2)
    assert one["default_pool_gib"] == 0.5 and one["largest_segment_gib"] == 0.5 and one["segments"] == 4
    assert one["device_used_gib"] == 31.5 and one["inactive_split_gib"] == 0.3
    readings = [("asleep", 0.9, 0.8), ("awake", 30.5, 30.2)]
    readings += [("gen", r, a) for r, a in ((30.5, 30.3), (30.9, 30.6), (31.3, 30.9), (31.3, 31.0), (32.5, 31.2))]
    for i, (phase, reserved, allocated) in enumerate(readings):
        rec.add("verl", 1, phase, _stats(reserved, allocated, retries=1 if i == 6 else 0), reserved + 1.0)
        rec.samples[-1]["t"] = 0.3 * i  # the readings' times, 0.3 s apart
    s = rec.close_round("verl", 1, generated_tokens=10)
    assert s["awake_reserved_gib"] == 30.5 and s["peak_reserved_gib"] == 32.5
    assert s["growth_gib"] == 2.0 and s["growth_first_s_gib"] == 0.8  # gen starts at 0.6 s; 1.6 s is past 1 s
    assert s["growth_steps_gib"] == [0.4, 0.4, 1.2]
    assert s["default_pool_growth_gib"] == 2.0 and s["default_pool_allocated_at_peak_gib"] == 0.0
    assert s["allocated_at_peak_gib"] == 31.2 and s["peak_allocated_gib"] == 31.2
    assert s["nvml_growth_gib"] == 2.0 and s["alloc_retries"] == 1 and s["generated_tokens"] == 10
    assert "growth +2.00 (first s +0.80) in 3 steps" in vp.summary_line(s)
    with pytest.raises(RecipeError, match="awake reading"):
        vp.round_summary([x for x in rec.samples if x["phase"] != "awake"])
    out = tmp_path / "pool.json"
    vp.write_record(out, rec.record({"pytorch_cuda_alloc_conf": "max_split_size_mb:128"}))
    back = json.loads(out.read_text())
    assert back["pytorch_cuda_alloc_conf"] == "max_split_size_mb:128"
    assert back["rounds"] == [s] and len(back["samples"]) == len(readings)
    assert back["samples"][1]["phase"] == "awake" and back["samples"][1]["nvml_used_gib"] == 31.5


@pytest.mark.skipif(rb.vllm_available(), reason="this host measures; the CPU path is for hosts without vLLM")
def test_the_campaigns_probe_runs_each_engine_and_says_how_each_ended(root: Path, tmp_path: Path) -> None:
    """gpu/probes/vllm-pool.sh as the campaign line runs it: every engine of the probe is tried (one
    failing leaves the next its turn), each refusal is its one line, and the probe's exit says so."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""}
    run = tmp_path / "run"
    res = subprocess.run(
        ["bash", "gpu/probes/vllm-pool.sh", str(run), "--verl-example", "gsm8k-quickstart"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.splitlines() == [f"error: {vp.NO_GPU}"] * 4
    assert run.is_dir() and not list(run.iterdir())
