"""The report on a recorded run: per-phase peaks match what the toy trainer allocated in each phase.

The fixture tests/fixtures/monitor/cpu-run was recorded on the CPU CI machine by
`verl-recipes monitor` around tests/fixtures/monitor/toy_trainer.py (verl's real marked_timer and
Tracking); it has no GPU fields (NVML is absent there, which its start record says). The GPU test
records the same toy trainer on CUDA and checks the per-phase device peaks.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from verl_recipes import GIB
from verl_recipes.measure.report import load_intervals, summarize, write_report
from verl_recipes.rundir import SAMPLES as SAMPLES_FILE
from verl_recipes.rundir import SUMMARY_SCHEMA as SCHEMA

FIXTURES = Path(__file__).parent / "fixtures" / "monitor"
CPU_RUN = FIXTURES / "cpu-run"
MiB = 1024**2


def _plan() -> dict[str, int]:
    """The toy trainer's phase -> MiB held, read from its source (no verl import needed)."""
    src = (FIXTURES / "toy_trainer.py").read_text()
    block = src[src.index("PLAN = [") : src.index("]\n", src.index("PLAN = [")) + 1]
    mod = ModuleType("toy_plan")
    exec(block, mod.__dict__)
    return dict(mod.PLAN)


def test_report_on_recorded_cpu_run(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "report", str(CPU_RUN), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["schema"] == SCHEMA and summary["exit_code"] == 0
    assert summary["gpus"] == [] and summary["nvml_error"]  # CPU fixture: no GPU fields, and why
    plan = _plan()
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    for st in summary["steps"]:
        assert set(plan) <= set(st["phases"]) and set(plan) <= set(st["timing_s"])
        assert st["time_s"] == pytest.approx(sum(st["timing_s"][p] for p in plan), rel=0.05)
        assert st["throughput"] == pytest.approx(1024 / st["time_s"], rel=1e-3)
        assert st["verl_memory_gib"] == {} and st["nvml_minus_verl_reserved_gib"] is None
        base = st["phases"]["adv"]["host"]["rss_gib"] * GIB  # adv holds nothing
        for phase, mib in plan.items():
            pk = st["phases"][phase]
            assert pk["samples"] >= 3, phase  # each phase held its buffer >= 0.5 s at 10 Hz
            extra = pk["host"]["rss_gib"] * GIB - base
            assert abs(extra - mib * MiB) <= 6 * MiB, (st["step"], phase, extra / MiB, mib)
    assert summary["peak"]["host"]["rss_gib"] == max(
        st["phases"]["update_actor"]["host"]["rss_gib"] for st in summary["steps"]
    )
    md = (tmp_path / "report.md").read_text()
    assert "| 1 | update_actor |" in md and "no GPU fields" in md and "![memory timeline](timeline.png)" in md
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_after_kill_9(tmp_path: Path) -> None:
    """A run whose monitor was killed mid-write: a torn last line is skipped, open phases are closed."""
    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    samples = (run / SAMPLES_FILE).read_bytes().splitlines(keepends=True)
    phases = (run / "phases.jsonl").read_bytes().splitlines(keepends=True)
    # cut both files in the middle of step 2's update_actor, as a kill -9 would leave them
    cut_t = next(json.loads(x)["t"] for x in phases if b'"update_actor"' in x and b'"step":2' in x) + 0.3
    kept = [x for x in samples if json.loads(x).get("t", 0) <= cut_t]
    (run / SAMPLES_FILE).write_bytes(b"".join(kept) + samples[len(kept)][:40])
    (run / "phases.jsonl").write_bytes(b"".join(x for x in phases if json.loads(x)["t"] <= cut_t))
    # verl logs a step's metrics at its end: step 2's line was never written
    metrics = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(b"".join(x for x in metrics if json.loads(x)["t"] <= cut_t))
    summary = write_report(run)
    assert summary["exit_code"] is None and summary["skipped_lines"] == 1
    step1, step2 = summary["steps"][:2]
    assert step2["phases"]["update_actor"]["samples"] >= 1
    # the phases cut open count in the peaks but have no time, nor has their step: the time to the
    # last sample is neither's, and a step time read from it would enter the bounds' medians
    assert step2["phases"]["update_actor"]["duration_s"] is None and step2["time_s"] is None
    assert "update_actor" not in step2["timing_s"] and step2["timing_s"]["gen"] > 0
    assert step1["time_s"] > 0
    assert "the monitor did not finish" in (run / "report.md").read_text()


def test_intervals_pair_nested_and_unclosed() -> None:
    recs = [
        {"t": 1.0, "event": "begin", "name": "step", "step": 1, "pid": 9},
        {"t": 2.0, "event": "begin", "name": "gen", "step": 1, "pid": 9},
        {"t": 3.0, "event": "end", "name": "gen", "step": 1, "pid": 9},
        {"t": 3.5, "event": "begin", "name": "update_actor", "step": 1, "pid": 9},
    ]
    ivs = load_intervals(recs, t_end=10.0)
    assert [(i.name, i.begin, i.end, i.open) for i in ivs] == [
        ("step", 1.0, 10.0, True),
        ("gen", 2.0, 3.0, False),
        ("update_actor", 3.5, 10.0, True),
    ]


def test_report_without_samples_is_a_one_line_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "verl-recipes monitor" in r.stderr


@pytest.mark.gpu
def test_report_attributes_gpu_memory_per_phase(tmp_path: Path) -> None:
    """The toy trainer on CUDA under the monitor: each phase's device peak rises by what it allocated."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if importlib.util.find_spec("verl") is None:
        pytest.skip("the toy trainer uses verl's marked_timer and Tracking: install verl==0.9.1")
    run = tmp_path / "gpu-run"
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "monitor", "--out", str(run), "--",
         sys.executable, str(FIXTURES / "toy_trainer.py"), "--device", "cuda", "--hold", "0.6"],
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0
    summary = summarize(run)
    assert summary["gpus"], summary["nvml_error"]
    plan = _plan()
    gpu = next(k for k, g in summary["peak"]["gpu"].items() if "driver" in g["by_class_gib"])  # NVML's index
    for st in summary["steps"][1:]:  # step 1 includes CUDA context creation in `gen`
        base = st["phases"]["adv"]["gpu"][gpu]["by_class_gib"]["driver"] * GIB
        for phase, mib in plan.items():
            got = st["phases"][phase]["gpu"][gpu]["by_class_gib"]["driver"] * GIB - base
            assert abs(got - mib * MiB) <= max(0.01 * mib * MiB, 2 * MiB), (phase, got / MiB, mib)
        assert st["verl_max_reserved_gib"] == pytest.approx(max(plan.values()) * MiB / GIB, rel=0.02)
        assert st["nvml_minus_verl_reserved_gib"] > 0  # the CUDA context is outside torch's allocator
    write_report(run)


def test_report_reads_gzipped_samples_the_same(tmp_path: Path) -> None:
    """Committed results keep samples.jsonl gzipped; the report must not change because of it."""
    import gzip
    import shutil

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    shutil.copytree(CPU_RUN, packed)
    with open(packed / "samples.jsonl", "rb") as src, gzip.open(packed / "samples.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (packed / "samples.jsonl").unlink()
    outs = []
    for run, out in ((CPU_RUN, plain), (packed, tmp_path / "packed-out")):
        r = subprocess.run(
            [sys.executable, "-m", "verl_recipes.cli", "report", str(run), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        s = json.loads((out / "summary.json").read_text())
        s.pop("run_dir", None)
        outs.append(s)
    assert outs[0] == outs[1] and outs[0]["samples"] > 100


def test_phase_end_reading_counts_for_the_ending_phase(tmp_path: Path) -> None:
    """A device reading on a phase's end line raises that phase's peak, not the next phase's.

    The recorded CPU run has no GPU; a copy gets one GPU in its start record and every sample
    (100 MiB), and one end line of update_actor carries a 900 MiB reading taken at the phase end.
    """
    import shutil

    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    lines = []
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "start":
            r["gpus"] = [{"index": 3, "uuid": "GPU-x", "name": "fake", "total_bytes": 8 * GIB, "driver": "0"}]
        if r.get("kind") == "sample":
            r["gpus"] = [{"index": 3, "used": 100 * MiB, "procs": []}]
        lines.append(json.dumps(r))
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    phases = [json.loads(x) for x in (run / "phases.jsonl").read_text().splitlines() if x.strip()]
    end = next(p for p in phases if p.get("event") == "end" and p["name"] == "update_actor")
    end["gpu_used"] = {"3": 900 * MiB, "7": 5 * GIB}  # GPU 7 is not the run's: ignored
    (run / "phases.jsonl").write_text("\n".join(json.dumps(p) for p in phases) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "report", str(run)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["phases"]["update_actor"]["gpu"]["3"]["used_gib"] == pytest.approx(900 / 1024, abs=1e-3)
    for phase, pk in s["phases"].items():
        if phase != "update_actor" and pk["gpu"]:
            assert pk["gpu"]["3"]["used_gib"] == pytest.approx(100 / 1024, abs=1e-3), phase
        assert "7" not in pk["gpu"]
    step = next(st for st in s["steps"] if st["step"] == end["step"])
    assert step["phases"]["update_actor"]["gpu"]["3"]["used_gib"] == pytest.approx(900 / 1024, abs=1e-3)


def test_report_shows_the_monitors_own_cpu_by_part(tmp_path: Path) -> None:
    """A committed H200 run whose exit record splits the sampler's CPU: the summary's share is CPU
    over wall, its parts add up to it, and report.md says it in one line."""
    import gzip

    run = Path(__file__).parent.parent / "recipes" / "7b-lora" / "results" / "h200x1-ppo-3"
    with gzip.open(run / "samples.jsonl.gz", "rt") as f:
        exit_rec = [json.loads(line) for line in f if '"kind":"exit"' in line][-1]
    cost = summarize(run)["monitor"]
    assert cost["core_share"] == pytest.approx(exit_rec["sampler_cpu_s"] / exit_rec["wall_s"], rel=1e-3)
    assert sum(cost["parts_core_share"].values()) == pytest.approx(cost["core_share"], rel=1e-3)
    assert cost["members_max"] == exit_rec["members_max"] > 0
    write_report(run, tmp_path)
    line = next(ln for ln in (tmp_path / "report.md").read_text().splitlines() if "monitor's own CPU" in ln)
    assert f"{100 * cost['core_share']:.2f}% of one core" in line and "host_full" in line
    # an exit record without the split (older runs) gives the total alone, not an error
    assert summarize(CPU_RUN)["monitor"]["parts_core_share"] == {}


def test_startup_stages_of_committed_runs_add_up_to_the_first_step() -> None:
    """The start-up table from verl's own log stamps, on a warm 7B run and a cold 4-layer one."""
    root = Path(__file__).resolve().parents[1] / "recipes" / "7b-lora" / "results"
    warm = summarize(root / "h200x1-ppo-3")["startup"]
    cold = summarize(root / "failed" / "h200x1-ppo-l4-sync-probe-timeout")["startup"]
    for boot in (warm, cold):
        assert abs(sum(st["s"] for st in boot["stages"]) - boot["to_first_step_s"]) < 0.05
        assert boot["stages"][-1]["stage"].startswith("first step begins")
    names = [st["stage"] for st in warm["stages"]]
    assert names[0].startswith("driver start") and any(n.startswith("vLLM server up") for n in names)
    assert warm["to_first_step_s"] == pytest.approx(281.2, abs=0.1)
    assert warm["vllm_s"] == {}  # verl's WARN level hid vLLM's own timings then
    assert cold["vllm_s"]["torch.compile"] == pytest.approx(11.9) and "CUDA graph capture" in cold["vllm_s"]


def test_a_killed_run_says_in_which_step_and_phase_it_ended() -> None:
    run = Path(__file__).resolve().parents[1] / "recipes" / "7b-lora" / "results" / "failed"
    ended = summarize(run / "h200x1-ppo-l4-sync-probe-timeout")["ended"]
    assert (ended["ok"], ended["exit_code"], ended["step"], ended["phase"]) == (False, None, 1, "step")


def test_vllms_start_is_cut_at_each_of_its_processes() -> None:
    """At VLLM_LOGGING_LEVEL=INFO vLLM's own stamps (month-day, no year) split its server start into
    its processes; they add up to the one stage an older run's log gives, and a run whose log has
    them not (WARN level) keeps that one stage."""
    root = Path(__file__).resolve().parents[1] / "recipes" / "7b-lora" / "results"
    boot = summarize(root / "h200x1-ppo-fast")["startup"]
    by = {st["stage"]: st for st in boot["stages"]}
    vllm = [st for st in boot["stages"] if st["stage"].startswith("vLLM")]
    assert [st["stage"] for st in vllm] == [
        "vLLM server actor start (Ray, imports)",
        "vLLM model config (architecture inspection)",
        "vLLM engine core process start",
        "vLLM worker process start",
        "vLLM load, compile, KV cache, CUDA graphs, warm-up",
        "vLLM server up, checkpoint engine",
    ]
    # from the reward loop to the checkpoint engine: 327.25 - 149.91 s, the old single stage
    assert sum(st["s"] for st in vllm) == pytest.approx(177.3, abs=0.1)
    assert by["vLLM model config (architecture inspection)"]["s"] == pytest.approx(25.0)
    assert abs(sum(st["s"] for st in boot["stages"]) - boot["to_first_step_s"]) < 0.05
    old = summarize(root / "h200x1-ppo-3")["startup"]
    old_vllm = [st["stage"] for st in old["stages"] if st["stage"].startswith("vLLM")]
    assert old_vllm == ["vLLM server up, checkpoint engine"]


def _phase_spans(run: Path) -> list[tuple[str, int, float, float]]:
    from verl_recipes.rundir import PHASES, read_jsonl

    opened: dict[tuple[str, int], float] = {}
    spans = []
    for e in read_jsonl(run / PHASES)[0]:
        key = (e["name"], e["step"])
        if e["event"] == "begin":
            opened[key] = e["t"]
        elif key in opened:
            spans.append((e["name"], e["step"], opened.pop(key), e["t"]))
    return spans


def test_load_per_phase_is_the_mean_of_its_readings_from_step_2(root: Path) -> None:
    """The GRPO 8x8 run's old_log_prob: NVML's utilization readings inside the phase's own spans
    of steps 2+ (the phase is innermost there), averaged; step 1 is left out."""
    from verl_recipes.rundir import read_jsonl

    run = root / "recipes/7b-lora/results/h200x1-grpo-8x8-2"
    load = summarize(run)["load"]
    spans = [(a, b) for name, step, a, b in _phase_spans(run) if name == "old_log_prob" and step >= 2]
    readings = [
        s["gpus"][0]["util"]
        for s in read_jsonl(run / SAMPLES_FILE)[0]
        if s.get("kind") == "sample" and s["gpus"][0].get("util") is not None and any(a <= s["t"] < b for a, b in spans)
    ]
    got = load["old_log_prob"]["gpus"]["0"]
    assert got["readings"] == len(readings) >= 6
    assert got["util_pct"] == pytest.approx(sum(readings) / len(readings), abs=0.05)
    assert load["old_log_prob"]["cpu_cores"] == {}  # recorded before /proc CPU was read


def test_load_table_names_the_busiest_host_processes(tmp_path: Path) -> None:
    """CPU cores per process class, as the monitor now writes them, averaged per phase."""
    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    lines = (run / SAMPLES_FILE).read_text().splitlines()
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("kind") == "sample" and "host" in rec:
            rec["host"]["cpu_by_class"] = {"driver": 1.0, "ray_worker": 0.5}
            rec["host"]["host_cpu"] = {"busy": 2.0, "steal": 0.25}
        out.append(json.dumps(rec))
    (run / SAMPLES_FILE).write_text("\n".join(out) + "\n")
    summary = write_report(run)
    assert summary["load"]["update_actor"]["cpu_cores"] == {"driver": 1.0, "ray_worker": 0.5}
    assert summary["load"]["update_actor"]["host_cpu"] == {"busy": 2.0, "steal": 0.25}
    md = (run / "report.md").read_text()
    table = md.split("## Load per phase")[1]
    assert "| update_actor |" in table and "1.5 (driver 1.0, ray_worker 0.5) | 2.0 / 0.25 |" in table
    assert "| host cores busy / stolen (all processes) |" in table


def test_vllm_s_own_picks_come_from_its_log(root: Path) -> None:
    """The PPO run of 2026-12-04: vLLM 0.24.0 on the H200 took FlashAttention 3 of four backends and
    captured CUDA graphs for 19 batch sizes up to 128, as its own log lines say; a run whose log
    has none of these lines has no picks and no report line."""
    from verl_recipes.measure.startup import picks_line

    run = root / "recipes/7b-lora/results/h200x1-ppo-5"
    picks = summarize(run)["startup"]["vllm_picks"]
    from verl_recipes.rundir import read_log

    log = read_log(run / "train.log")  # committed gzipped
    assert picks["attention_backend"] == "FLASH_ATTN" and "Using FLASH_ATTN attention backend" in log
    assert picks["flash_attention_version"] == 3 and "FLASHINFER" in picks["attention_backends_possible"]
    assert picks["cudagraph_capture_sizes"][:4] == [1, 2, 4, 8] and picks["cudagraph_capture_sizes"][-1] == 128
    assert picks["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    line = picks_line(picks)
    assert line is not None and line.startswith("vLLM's own picks: attention FLASH_ATTN (FlashAttention 3), of ")
    assert summarize(root / "recipes/7b-lora/results/h200x1-ppo-3")["startup"]["vllm_picks"] == {}
    assert picks_line({}) is None


def test_a_start_up_without_verls_stages_is_not_called_verls_weight_sync() -> None:
    """The last stage before step 1 is verl's initial weight sync only after verl's milestones; a log
    that names none of them (another training loop's, or none) has one stage, the whole start-up."""
    from verl_recipes.measure.startup import FIRST_STEP, TO_FIRST_STEP, stages

    assert stages(100.0, {}, 123.8) == [{"stage": TO_FIRST_STEP, "s": 23.8, "at_s": 23.8}]
    found = {"trainer ready": 150.0}
    assert [s["stage"] for s in stages(100.0, found, 151.5)] == ["trainer ready", FIRST_STEP]
    for name in ("h200x1-ppo-rank0of4-deepspeed", "h200x1-ppo-rank0of2-deepspeed"):
        run = Path(__file__).resolve().parents[1] / "recipes/verl-vs-deepspeed/results" / name
        summary = json.loads((run / "summary.json").read_text())
        assert [s["stage"] for s in summary["startup"]["stages"]] == [TO_FIRST_STEP], name


def test_a_committed_runs_gzipped_log_reads_as_the_plain_one(root: Path, tmp_path: Path) -> None:
    """Committed results keep train.log gzipped (a ninth of the size of what travels to a GPU host).
    The start-up stages, vLLM's own timings and picks come from that log: a copy with the log
    unpacked gives the same summary, and a copy with no log at all does not (so the log is read)."""
    import gzip
    import shutil

    from verl_recipes.rundir import read_log

    src = root / "recipes/13b-fsdp/results/h200x1-ppo-rank0of2-fixedlen"
    assert (src / "train.log.gz").is_file() and not (src / "train.log").exists()
    plain, bare = tmp_path / "plain", tmp_path / "bare"
    shutil.copytree(src, plain)
    shutil.copytree(src, bare)
    with gzip.open(plain / "train.log.gz", "rb") as f:
        (plain / "train.log").write_bytes(f.read())
    (plain / "train.log.gz").unlink()
    (bare / "train.log.gz").unlink()
    assert read_log(plain / "train.log") == read_log(src / "train.log") != ""
    got = {}
    for name, run in (("packed", src), ("plain", plain), ("bare", bare)):
        s = summarize(run)
        s.pop("run_dir", None)
        got[name] = s
    assert got["packed"] == got["plain"]
    assert got["packed"]["startup"]["vllm_picks"] and got["packed"]["startup"]["vllm_s"]
    assert got["bare"]["startup"] != got["packed"]["startup"]


def test_a_gzipped_log_cut_short_is_read_up_to_where_it_ends(tmp_path: Path) -> None:
    import gzip

    from verl_recipes.rundir import read_log

    packed = gzip.compress("".join(f"line {i}\n" for i in range(20000)).encode())
    (tmp_path / "train.log.gz").write_bytes(packed[: len(packed) // 2])
    text = read_log(tmp_path / "train.log")
    assert text.startswith("line 0\n") and 0 < len(text.splitlines()) < 20000
    assert read_log(tmp_path / "absent.log") == ""
