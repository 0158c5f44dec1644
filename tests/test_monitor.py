"""The monitor on real processes: host RAM of a process tree, kill -9, exit codes, overhead, GPUs."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from verl_recipes import GIB
from verl_recipes.measure.monitor import PEAK_RISE, Monitor, _due, classify
from verl_recipes.rundir import RUN_DIR_ENV, read_jsonl
from verl_recipes.rundir import SAMPLES as SAMPLES_FILE

MiB = 1024**2

CLI = [sys.executable, "-m", "verl_recipes.cli", "monitor"]


def _samples(run: Path) -> list[dict]:
    recs, bad = read_jsonl(run / SAMPLES_FILE)
    assert bad == 0
    return [r for r in recs if r["kind"] == "sample"]


def test_classify_names_verl_and_vllm_processes() -> None:
    assert classify(["ray::WorkerDict.actor_rollout_update_actor"]) == (
        "fsdp_worker",
        "ray::WorkerDict.actor_rollout_update_actor",
    )
    assert classify(["ray::ActorRolloutRefWorker"])[0] == "fsdp_worker"
    assert classify(["ray::CriticWorker.init_model"])[0] == "fsdp_worker"
    assert classify(["VLLM::EngineCore"])[0] == "vllm_engine"
    assert classify(["ray::vLLMHttpServer.generate"])[0] == "vllm_engine"
    assert classify(["ray::TaskRunnerV1.run"])[0] == "ray_worker"
    assert classify(["ray::AgentLoopWorkerTQ"])[0] == "ray_worker"
    assert classify(["ray::IDLE"])[0] == "ray_worker"
    assert classify(["/venv/lib/python3.12/site-packages/ray/core/src/ray/raylet/raylet", "--x"])[0] == "ray_system"
    assert classify(["python3", "-m", "verl.trainer.main_ppo"], is_root=True) == (
        "driver",
        "python3 -m verl.trainer.main_ppo",
    )
    assert classify(["python3", "train.py"]) == ("other", "python3 train.py")


# A parent that starts two grandchildren holding 128 and 192 MiB of touched memory, records their pids
# in the run dir (proving it saw VERL_RECIPES_RUN_DIR) and exits 5.
_TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    run = os.environ["VERL_RECIPES_RUN_DIR"]
    hold = "import sys, time; x = bytearray(b'\\\\x01') * (int(sys.argv[1]) << 20); time.sleep(2.5)"
    kids = [subprocess.Popen([sys.executable, "-c", hold, str(m)]) for m in (128, 192)]
    with open(os.path.join(run, "kids.json"), "w") as f:
        f.write(str([k.pid for k in kids]))
    for k in kids:
        k.wait()
    time.sleep(0.3)
    sys.exit(5)
    """
)


def test_host_ram_of_process_tree_and_exit_code(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = subprocess.run([*CLI, "--out", str(run), "--", sys.executable, "-c", _TREE], timeout=60)
    assert r.returncode == 5
    kids = json.loads((run / "kids.json").read_text())
    samples = [s for s in _samples(run) if "host" in s]  # host memory is read at 2 Hz
    peak = {pid: max(s["host"]["pids"].get(str(pid), 0) for s in samples) for pid in kids}
    for pid, mib in zip(kids, (128, 192), strict=True):
        # a bare python -c process is ~10 MiB RSS; the touched buffer is exactly `mib`
        assert mib * MiB <= peak[pid] <= (mib + 25) * MiB, (pid, peak[pid] / MiB)
    total = max(s["host"]["rss"] for s in samples)
    assert total >= 320 * MiB
    # USS is sampled every 2 s: the grandchildren's private memory shows in at least one sample
    assert max(s["host"]["uss"] or 0 for s in samples) >= 300 * MiB
    recs, _ = read_jsonl(run / SAMPLES_FILE)
    assert recs[0]["kind"] == "start"
    assert (recs[0]["gpus"] == []) == (recs[0]["nvml_error"] is not None)  # on a CPU host: no GPU fields, a reason
    assert recs[-1]["kind"] == "exit" and recs[-1]["rc"] == 5


_BUSY_AND_IDLE = """
import subprocess, sys, time
idle = subprocess.Popen(["sleep", "4"])
t = time.time()
while time.time() - t < 4:
    pass
idle.wait()
"""


def test_cpu_cores_busy_per_process(tmp_path: Path) -> None:
    """A process spinning on one core reads as about one core busy between host readings, its
    sleeping child as none: the figure that names who competes with a phase for the host."""
    run = tmp_path / "run"
    r = subprocess.run([*CLI, "--out", str(run), "--", sys.executable, "-c", _BUSY_AND_IDLE], timeout=60)
    assert r.returncode == 0
    procs = {x["pid"]: x for x in read_jsonl(run / SAMPLES_FILE)[0] if x["kind"] == "proc"}
    root = next(pid for pid, x in procs.items() if "idle.wait" in x["cmdline"])
    sleeper = next(pid for pid, x in procs.items() if x["cmdline"] == "sleep 4")
    readings = [s["host"] for s in _samples(run) if "host" in s]
    assert "cpu_by_class" not in readings[0]  # no previous reading to count from
    spans = [h["cpu_by_class"] for h in readings[1:] if h["n"] == 2][1:-1]  # the spinner and the sleeper
    assert len(spans) >= 4
    assert procs[root]["class"] != procs[sleeper]["class"], "the test needs the two in different classes"
    busy = sorted(sp.get(procs[root]["class"], 0.0) for sp in spans)
    idle = [sp.get(procs[sleeper]["class"], 0.0) for sp in spans]
    # one core at most, less when the machine's other core work takes turns with it
    assert busy[len(busy) // 2] >= 0.5 and busy[-1] <= 1.3, busy
    assert max(idle) < 0.1, idle
    # the whole host counts the spinner too: never fewer cores busy than the run's own processes
    whole = [h["host_cpu"] for h in readings[1:] if h["n"] == 2][1:-1]
    assert len(whole) == len(spans)
    for sp, h in zip(spans, whole, strict=True):
        assert h["busy"] >= sum(sp.values()) - 0.15 and h["steal"] >= 0, (sp, h)


def test_host_cpu_ticks_read_busy_and_steal_from_proc_stat(tmp_path: Path) -> None:
    """/proc/stat's `cpu` line: user nice system idle iowait irq softirq steal ...; busy leaves
    idle and iowait out. A file without that line reads as nothing, never as zero."""
    from verl_recipes.measure.monitor import host_cpu_ticks

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 20 9000 30 1 2 7 0 0\ncpu0 50 2 10 4500 15 0 1 3 0 0\n")
    assert host_cpu_ticks(str(stat)) == (100 + 5 + 20 + 1 + 2, 7)
    stat.write_text("intr 1 2 3\n")
    assert host_cpu_ticks(str(stat)) is None
    assert host_cpu_ticks(str(tmp_path / "absent")) is None
    here = host_cpu_ticks()
    assert here is not None and here[0] > 0


def test_exit_code_of_a_signalled_child(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            *CLI,
            "--out",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            "import os, signal; os.kill(os.getpid(), 15)",
        ],
        timeout=60,
    )
    assert r.returncode == 128 + signal.SIGTERM


def test_missing_command_is_a_one_line_error(tmp_path: Path) -> None:
    r = subprocess.run([*CLI, "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: give the command to monitor after --")
    r = subprocess.run(
        [*CLI, "--out", str(tmp_path), "--", "no-such-binary-xyz"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "cannot start 'no-such-binary-xyz'" in r.stderr


def test_jsonl_survives_kill_9_of_the_monitor(tmp_path: Path) -> None:
    run = tmp_path / "run"
    mon = subprocess.Popen([*CLI, "--out", str(run), "--interval", "0.02", "--", "sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (run / SAMPLES_FILE).is_file() and len((run / SAMPLES_FILE).read_bytes().splitlines()) > 40:
                break
            time.sleep(0.05)
        os.kill(mon.pid, signal.SIGKILL)  # mid-run: the sampler writes 50 lines a second
        mon.wait(timeout=10)
    finally:
        if mon.poll() is None:
            mon.kill()
    raw = (run / SAMPLES_FILE).read_bytes()
    lines = raw.splitlines()
    assert raw.endswith(b"\n") and len(lines) > 40
    recs = [json.loads(x) for x in lines]  # every line parses
    assert recs[0]["kind"] == "start" and all(r["kind"] != "exit" for r in recs)
    # the monitored command does not outlive a monitor killed by a signal no handler sees
    child = recs[0]["pid"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
        time.sleep(0.05)
    alive = psutil.pid_exists(child) and psutil.Process(child).status() != "zombie"
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the monitored command outlived its killed monitor"


def test_env_tagged_process_outside_the_tree_is_monitored(tmp_path: Path) -> None:
    """A process started elsewhere (e.g. by an external raylet) but carrying our run dir counts."""
    run = tmp_path / "run"
    run.mkdir()
    code = "x = bytearray(b'\\x01') * (64 << 20); import time; time.sleep(30)"
    tagged = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, RUN_DIR_ENV: str(run.resolve())})
    untagged = subprocess.Popen([sys.executable, "-c", code])
    root = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(1.0)
        mon = Monitor(run, root_pid=root.pid)
        rec = mon.sample_once()
        mon.stop()
    finally:
        for p in (tagged, untagged, root):
            p.kill()
            p.wait()
    assert set(rec["host"]["pids"]) == {str(root.pid), str(tagged.pid)}
    assert rec["host"]["pids"][str(tagged.pid)] >= 64 * MiB


def _overhead(tmp_path: Path, members: int, seconds: float) -> tuple[Monitor, float, float]:
    """Run the monitor over a tree of `members` processes the way `verl-recipes train` does
    (10 Hz device total, host RSS and NVML per-process lists at 2 Hz, USS/PSS every 60 s)."""
    sleepers = (
        f"import subprocess as s, time; [s.Popen(['sleep', '{seconds + 10}']) for _ in range({members - 1})]; "
        f"time.sleep({seconds + 10})"
    )
    root = subprocess.Popen([sys.executable, "-c", sleepers])
    try:
        time.sleep(1.0)
        t0 = time.monotonic()
        with Monitor(tmp_path, interval=0.1, root_pid=root.pid, full_mem_s=60) as mon:
            time.sleep(1.0)
            cpu1, n1, t1 = mon.sampler_cpu_s, mon.samples, time.monotonic()
            time.sleep(seconds)
        wall = time.monotonic() - t0
        steady_wall = time.monotonic() - t1
    finally:
        for kid in psutil.Process(root.pid).children():
            kid.kill()
        root.kill()
        root.wait()
    share = mon.sampler_cpu_s / wall
    steady = (mon.sampler_cpu_s - cpu1) / steady_wall
    print(
        f"\nsampler over {members} processes: {mon.samples} samples in {wall:.1f} s, cpu "
        f"{mon.sampler_cpu_s * 1e3:.1f} ms = {share * 100:.3f}% of one core; steady state {steady * 100:.3f}%, "
        f"{(mon.sampler_cpu_s - cpu1) / (mon.samples - n1) * 1e6:.0f} us/sample; by part (ms): "
        + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(mon.sampler_cpu_parts_s.items()))
    )
    # the parts account for the whole: an overhead above budget names its cause in the exit record
    assert sum(mon.sampler_cpu_parts_s.values()) == pytest.approx(mon.sampler_cpu_s, rel=1e-6, abs=1e-6)
    exit_rec = read_jsonl(tmp_path / SAMPLES_FILE)[0][-1]
    assert exit_rec["kind"] == "exit" and exit_rec["members_max"] == members
    assert set(exit_rec["sampler_cpu_parts_s"]) >= {"tree", "host_rss", "write"}
    return mon, share, wall


def test_sampler_overhead(tmp_path: Path) -> None:
    """The host path at 10 Hz over 60 processes (a 7B verl run has 45-61) costs under 1% of one core.

    The first sample reads /proc/PID/stat and /proc/PID/environ of every process on the host once
    and the USS/PSS of every member; after that only new pids and the tree's members are read.
    Measured here (2-core CI VM): 1.30% of one core with every reading at 10 Hz, 0.4-0.6% with host
    RSS at 2 Hz and USS/PSS every 60 s, whole run including the first sample.
    """
    mon, share, wall = _overhead(tmp_path, 60, 12.0)
    hosted = [s for s in _samples(tmp_path) if "host" in s]
    assert max(len(s["host"]["pids"]) for s in hosted) == 60
    assert mon.samples >= 0.9 * wall / 0.1  # the device path at ~10 Hz
    span = hosted[-1]["t"] - hosted[0]["t"]
    assert len(hosted) >= 0.9 * span / 0.5 + 1  # host RSS at ~2 Hz while the loop runs
    assert share < 0.01


def test_periodic_readings_keep_their_cadence_on_late_ticks() -> None:
    """A 10 Hz loop whose ticks land 1-9 ms late still reads the 0.5 s parts twice a second, and a
    stall restarts the cadence instead of firing a burst of catch-up readings."""
    due, fired, t = -1e18, [], 100.0
    for i in range(200):  # 20 s of ticks, each 0.1 s plus a late landing
        t += 0.1 + 0.001 * (1 + i % 9)
        now, due = _due(t, due, 0.5)
        if now:
            fired.append(t)
    span = fired[-1] - fired[0]
    assert len(fired) == pytest.approx(span / 0.5 + 1, abs=1)
    now, due = _due(fired[-1] + 5.0, due, 0.5)  # a 5 s stall: one reading, then half a second's rest
    assert now and not _due(fired[-1] + 5.1, due, 0.5)[0] and _due(fired[-1] + 5.5, due, 0.5)[0]


# A process with tens of thousands of memory mappings: /proc/PID/smaps_rollup walks every one, which
# is what makes USS/PSS reads of CUDA processes costly (0.32-0.37 s for a 7B verl run's processes).
_MANY_MAPPINGS = textwrap.dedent(
    """
    import ctypes, mmap, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    n, page = int(sys.argv[1]), mmap.PAGESIZE
    base = libc.mmap(None, n * page, 3, 0x22, -1, 0)      # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    ctypes.memset(base, 1, n * page)
    for i in range(0, n, 2):                               # alternate protections: one mapping a page
        libc.mprotect(ctypes.c_void_p(base + i * page), page, 1)
    print("ready", flush=True)
    time.sleep(120)
    """
)


def test_uss_pss_reads_keep_to_their_share_of_a_core(tmp_path: Path) -> None:
    """USS/PSS reads are spaced by their own measured cost: never more than `full_mem_share` of a core
    (plus the one read that measured it), however short `full_mem_s` is."""
    kids = [
        subprocess.Popen([sys.executable, "-c", _MANY_MAPPINGS, "30000"], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for k in kids:
            assert k.stdout is not None and k.stdout.readline().strip() == "ready"
        share, wall = 0.02, 12.0
        with Monitor(tmp_path, root_pid=os.getpid(), full_mem_s=0.2, full_mem_share=share) as mon:
            time.sleep(wall)
        full_cpu = mon.sampler_cpu_parts_s["host_full"]
        per_read = full_cpu / mon.full_reads
        print(f"\n{mon.full_reads} USS/PSS reads, {per_read * 1e3:.1f} ms each, {full_cpu / wall:.4f} of a core")
        assert per_read > 0.01, "the fixture should make smaps_rollup slow"
        assert 2 <= mon.full_reads <= wall / 0.2 / 4  # spaced out, not stopped
        assert full_cpu <= share * wall + 2 * per_read
        hosted = [r for r in _samples(tmp_path) if "host" in r]
        assert sum(r["host"]["uss"] is not None for r in hosted) == mon.full_reads
        assert read_jsonl(tmp_path / SAMPLES_FILE)[0][-1]["full_reads"] == mon.full_reads
    finally:
        for k in kids:
            k.kill()
            k.wait()


def test_monitor_refuses_a_bad_full_mem_share(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "monitor", "--out", str(tmp_path / "r"), "--full-mem-share", "0",
         "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("error: --full-mem-share must be a share of one core")
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_sampler_overhead_with_nvml(tmp_path: Path) -> None:
    """The same on a GPU host, NVML included (device total at 10 Hz, per-process list at 2 Hz)."""
    mon, share, _ = _overhead(tmp_path, 60, 12.0)
    assert mon.nvml.handles, "no GPU visible to NVML"
    samples = _samples(tmp_path)
    assert all(s["gpus"] and "used" in s["gpus"][0] for s in samples)
    assert share < 0.01


_GPU_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.empty(1, device="cuda"); torch.cuda.synchronize()
    print("ready", flush=True); sys.stdin.readline()
    x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("alloc", flush=True); sys.stdin.readline()
    """
)


@pytest.mark.gpu
def test_gpu_memory_attributed_per_process(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    sizes = (3.0, 5.0)
    kids = [
        subprocess.Popen(
            [sys.executable, "-c", _GPU_CHILD, str(s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
        )
        for s in sizes
    ]
    try:
        for k in kids:
            assert k.stdout is not None and k.stdout.readline().strip() == "ready"
        mon = Monitor(tmp_path, root_pid=os.getpid(), procs_s=0.0)  # the per-process list on every sample
        assert mon.nvml.handles, mon.nvml.error

        def per_pid(rec: dict) -> dict[int, int]:
            return {p["pid"]: p["used"] for g in rec["gpus"] if g["index"] == 0 for p in g["procs"]}

        before = mon.sample_once()
        for k in kids:
            assert k.stdin is not None and k.stdout is not None
            k.stdin.write("\n")
            k.stdin.flush()
            assert k.stdout.readline().strip() == "alloc"
        after = mon.sample_once()
        mon.stop()
        b, a = per_pid(before), per_pid(after)
        for k, size in zip(kids, sizes, strict=True):
            assert k.pid in a, f"NVML pids {sorted(a)} are not this pid namespace's (a container without --pid=host?)"
            delta = a[k.pid] - b[k.pid]
            assert abs(delta - size * GIB) <= 0.01 * size * GIB, (size, delta / GIB)
        dev = (
            next(g for g in after["gpus"] if g["index"] == 0)["used"]
            - next(g for g in before["gpus"] if g["index"] == 0)["used"]
        )
        assert abs(dev - sum(sizes) * GIB) <= 0.01 * sum(sizes) * GIB, dev / GIB
        print(f"\nNVML sampler: {mon.sampler_cpu_s / mon.samples * 1e3:.2f} ms/sample, {len(a)} GPU processes")
    finally:
        for k in kids:
            k.kill()
            k.wait()


# ---- phases: verl's real marked_timer and Tracking, patched by verl_recipes.worker.markers ----------

_PHASES_BEFORE = textwrap.dedent(
    """
    import json, sys
    from verl_recipes.worker import markers
    assert markers.install()
    from verl.utils.debug import marked_timer          # imported after install(): patched on import
    import verl.utils.profiler
    from verl.utils.tracking import Tracking
    assert marked_timer is verl.utils.profiler.marked_timer and marked_timer.__wrapped__

    class Trainer:                                      # verl's loop shape: self.global_steps, timing_raw
        global_steps = 7
        def step(self):
            timing_raw = {}
            with marked_timer("step", timing_raw):
                with marked_timer("gen", timing_raw, color="red"):
                    sum(range(10000))
                try:
                    with marked_timer("update_actor", timing_raw, color="red"):
                        raise ValueError("boom")
                except ValueError:
                    pass
            return timing_raw

    timing = Trainer().step()
    logger = Tracking(project_name="p", experiment_name="e", default_backend=["console"])
    import numpy as np
    logger.log(data={"perf/max_memory_reserved_gb": np.float64(1.25), "timing_s/gen": timing["gen"],
                     "perf/throughput": 10, "bad": float("nan"), "table": [1, 2]}, step=7)
    print(json.dumps(timing))
    """
)


needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl==0.9.1 installed")


def _jsonl(path: Path) -> list[dict]:
    recs, bad = read_jsonl(path)
    assert bad == 0
    return recs


@needs_verl
def test_phases_install_before_verl_import(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _PHASES_BEFORE],
        env={**os.environ, RUN_DIR_ENV: str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    timing = json.loads(r.stdout.strip().splitlines()[-1])
    # verl's own timer still times (it records nothing for a phase that raised; our end line says ok=false)
    assert set(timing) == {"step", "gen"} and timing["gen"] > 0
    ph = _jsonl(tmp_path / "phases.jsonl")
    assert [(p["event"], p["name"]) for p in ph] == [
        ("begin", "step"),
        ("begin", "gen"),
        ("end", "gen"),
        ("begin", "update_actor"),
        ("end", "update_actor"),
        ("end", "step"),
    ]
    assert {p["step"] for p in ph} == {7}
    assert [p["ok"] for p in ph if p["event"] == "end"] == [True, False, True]
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(ph))
    (m,) = _jsonl(tmp_path / "metrics.jsonl")
    assert m["step"] == 7 and m["metrics"] == {
        "perf/max_memory_reserved_gb": 1.25,
        "timing_s/gen": timing["gen"],
        "perf/throughput": 10,
    }


_PHASES_AFTER = textwrap.dedent(
    """
    import importlib, os, sys
    from verl.utils.debug import marked_timer as original
    import verl.utils.tracking
    sys.path.insert(0, sys.argv[1])
    import probe_trainer                               # did `from verl.utils.debug import marked_timer`
    assert probe_trainer.marked_timer is original
    real = []
    for name in ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base"):
        try:
            real.append(importlib.import_module(name))
        except ImportError as e:                        # this host lacks part of verl's GPU stack
            print("skip", name, e, file=sys.stderr)
    from verl_recipes.worker import markers
    assert markers.install()
    assert markers.install()                            # idempotent: no double wrapping
    assert probe_trainer.marked_timer is not original and probe_trainer.marked_timer.__wrapped__ is original
    for mod in real:
        assert mod.marked_timer.__wrapped__ is original, mod
    probe_trainer.Trainer().step()
    verl.utils.tracking.Tracking("p", "e", ["console"]).log({"timing_s/step": 1.5}, 3)
    print(len(real))
    """
)


@needs_verl
def test_phases_install_after_import_rebinds(tmp_path: Path) -> None:
    (tmp_path / "probe_trainer.py").write_text(
        textwrap.dedent(
            """
        from verl.utils.debug import marked_timer

        class Trainer:
            global_steps = 3
            def step(self):
                t = {}
                with marked_timer("step", t):
                    with marked_timer("adv", t):
                        pass
        """
        )
    )
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", _PHASES_AFTER, str(tmp_path)],
        env={**os.environ, RUN_DIR_ENV: str(run)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ph = _jsonl(run / "phases.jsonl")
    assert [(p["event"], p["name"], p["step"]) for p in ph] == [
        ("begin", "step", 3),
        ("begin", "adv", 3),
        ("end", "adv", 3),
        ("end", "step", 3),
    ]
    assert [m["metrics"] for m in _jsonl(run / "metrics.jsonl")] == [{"timing_s/step": 1.5}]


def test_phases_off_without_run_dir() -> None:
    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}
    code = "import sys\nfrom verl_recipes.worker import markers\nassert not markers.install()\n"
    code += "assert 'verl' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


_RAY_HOOK = textwrap.dedent(
    """
    import os, sys, ray
    run = sys.argv[1]
    ray.init(num_cpus=1, include_dashboard=False, runtime_env={
        "worker_process_setup_hook": "verl_recipes.worker.hooks.setup",
        "env_vars": {"VERL_RECIPES_RUN_DIR": run}})

    @ray.remote
    class TaskRunner:                                   # stands in for verl's TaskRunnerV1
        def run(self):
            from verl.utils.debug import marked_timer
            class Trainer:
                global_steps = 1
                def fit(self):
                    t = {}
                    with marked_timer("step", t):
                        with marked_timer("gen", t):
                            pass
            Trainer().fit()
            return os.getpid()

    print(ray.get(TaskRunner.remote().run.remote()))
    ray.shutdown()
    """
)


@needs_verl
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray installed")
def test_phases_setup_hook_in_a_ray_actor(tmp_path: Path) -> None:
    """The launcher's wiring: Ray's worker_process_setup_hook + env var; an actor calls marked_timer."""
    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}  # only the runtime_env carries it
    r = subprocess.run(
        [sys.executable, "-c", _RAY_HOOK, str(tmp_path)],
        env={**env, "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    actor_pid = int(r.stdout.strip().splitlines()[-1])
    ph = _jsonl(tmp_path / "phases.jsonl")
    assert [(p["event"], p["name"], p["step"], p["pid"]) for p in ph] == [
        ("begin", "step", 1, actor_pid),
        ("begin", "gen", 1, actor_pid),
        ("end", "gen", 1, actor_pid),
        ("end", "step", 1, actor_pid),
    ]


def test_sigterm_is_forwarded_and_recorded(tmp_path: Path) -> None:
    mon = subprocess.Popen([*CLI, "--out", str(tmp_path), "--", "sleep", "60"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (tmp_path / SAMPLES_FILE).is_file():
        time.sleep(0.05)
    time.sleep(0.5)
    mon.send_signal(signal.SIGTERM)
    assert mon.wait(timeout=30) == 128 + signal.SIGTERM  # the child's exit: killed by the forwarded SIGTERM
    recs, bad = read_jsonl(tmp_path / SAMPLES_FILE)
    assert bad == 0 and recs[-1]["kind"] == "exit" and recs[-1]["rc"] == -signal.SIGTERM


# A child that waits, then holds 400 MiB of touched memory for 2.5 s, frees it and lives on: a host
# peak between two periodic USS/PSS reads.
_SPIKE = textwrap.dedent(
    """
    import sys, time
    time.sleep(1.5)
    x = bytearray(b'\\x01') * (400 << 20)
    time.sleep(2.5)
    del x
    time.sleep(1.5)
    """
)


def test_pss_is_read_at_a_host_peak_between_periodic_reads(tmp_path: Path) -> None:
    """Periodic USS/PSS reads are minutes apart on a real run; a peak of seconds (the offloaded
    recipe's load copy) still gets one, taken at the RSS high, not after it is gone. The spike's
    pages arrive over a few samples on a loaded host, and the monitor reads again at each rise of
    PEAK_RISE: its highest read is within that of the high, and almost all of it the spike's own."""
    child = subprocess.Popen([sys.executable, "-c", _SPIKE])
    with Monitor(tmp_path, root_pid=child.pid, full_mem_s=600.0, peak_gap_s=0.3) as mon:
        child.wait(timeout=30)
    host = [s["host"] for s in _samples(tmp_path) if "host" in s]
    periodic = [h for h in host if h["pss"] is not None and h.get("read") != "peak"]
    peaks = [h for h in host if h.get("read") == "peak"]
    assert len(periodic) == 1  # the first reading only: the next periodic one is 600 s away
    high = max(h["rss"] for h in host)
    assert high >= 400 * MiB
    assert peaks, "no USS/PSS read at the spike"
    read = max(peaks, key=lambda h: h["rss"])
    assert read["rss"] * (1 + PEAK_RISE) >= high, ([h["rss"] / MiB for h in peaks], high / MiB)
    # the interpreter's own pages are a few MiB of the read; after the spike is gone it is all of it
    assert read["pss"] >= 0.95 * read["rss"] and read["uss"] >= 0.95 * read["rss"], read
    # each read raises the mark by 10% or more: a few reads, not one per sample
    assert mon.peak_reads == len(peaks) <= 4
    recs, _ = read_jsonl(tmp_path / SAMPLES_FILE)
    assert recs[-1]["kind"] == "exit" and recs[-1]["peak_reads"] == len(peaks)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_monitor_ends_the_whole_tree_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    """A wrapper shell with two background jobs: the shell dies of the signal, its children would
    live on, reparented, holding whatever they hold. Killing the monitor ends all of them."""
    run = tmp_path / "run"
    wrapper = "sleep 301 & sleep 302 & wait"
    mon = subprocess.Popen([*CLI, "--out", str(run), "--", "bash", "-c", wrapper])
    marker = f"{RUN_DIR_ENV}={run.resolve()}".encode()

    def tree() -> list[int]:
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                env = Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in env and p.pid != mon.pid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        return found

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(tree()) < 3:  # bash and its two sleeps
        time.sleep(0.1)
    assert len(tree()) == 3, tree()
    mon.send_signal(sig)
    mon.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and tree():
        time.sleep(0.1)
    left = tree()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after the monitor was killed with {sig.name}: {left}"
