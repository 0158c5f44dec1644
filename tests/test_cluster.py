"""The Ray-on-Slurm bootstrap (`verl_recipes.cluster`) and the sbatch templates.

Three layers, cheapest first:

* the checks and the srun lines as plain functions (no Slurm, no Ray);
* the templates through bash: `bash -n`, shellcheck, and DRY_RUN=1, which prints the srun lines
  pyxis (`--container-image`) and Apptainer (`apptainer exec --nv`) would run; neither runtime
  exists on the CI machine, so their lines are checked, not run;
* marker `slurm`: real jobs on the one-node Slurm that `.ci/slurm-up.sh` starts, with real Ray
  on the CPU. Debian's Slurm cannot run several slurmd on one host, so multi-node is probed
  with one Slurm node and several Ray nodes on it (RAY_NODES_PER_HOST), each its own srun step
  with its own ports: the head/worker/driver/teardown logic is the multi-node one, only the
  hosts coincide.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from verl_recipes import RecipeError, procs
from verl_recipes.cluster import in_step, launcher, settings, steps

ROOT = Path(__file__).resolve().parents[1]
T70 = ROOT / "recipes" / "70b-3d" / "slurm"
T13 = ROOT / "recipes" / "13b-fsdp" / "slurm"
TEMPLATES = sorted([*T70.glob("*.sbatch"), *T13.glob("*.sbatch")])
SHELL = [*TEMPLATES, ROOT / ".ci" / "slurm-up.sh", ROOT / ".ci" / "slurm-down.sh"]


def base_env(**kw: str) -> dict[str, str]:
    """A clean launch environment: nothing Slurm, Ray or template-related leaks in from the caller."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if (k == "SLURM_CONF" or not k.startswith(("SLURM_", "RAY_", "NCCL_", "GLOO_")))
        and k
        not in {
            "TP",
            "PP",
            "MODEL_PATH",
            "CONTAINER_IMAGE",
            "REHEARSAL",
            "PROBE",
            "GPUS_PER_NODE",
            "RECIPE",
            "TRAIN_CMD",
            "JOB_DIR",
            "VERIFY",
            "DRY_RUN",
            "VENV",
            "RUN_DIR",
        }
    }
    keep.update(kw)
    return keep


def env70(**kw: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_NODELIST": "n1,n2,n3,n4",
        "SLURM_JOB_ID": "42",
        "SLURM_GPUS_ON_NODE": "8",
        "TP": "4",
        "PP": "2",
        "MODEL_PATH": "meta-llama/Llama-2-70b-hf",
        "VERL_RECIPES_ROOT": str(ROOT),
        "RECIPE": "70b-3d",
        "TRAIN_CMD": "verl-recipes train 70b-3d",
    }
    env.update(kw)
    return env


def err(env: dict[str, str], runtime: str = "bare") -> str:
    with pytest.raises(RecipeError) as e:
        settings.check(env, runtime)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# --- checks, as functions ------------------------------------------------------------------------


def test_check_accepts_the_70b_shape() -> None:
    s = settings.check(env70(), "bare")
    assert s.hosts == ("n1", "n2", "n3", "n4")
    assert (s.ray_nodes, s.total_gpus, s.dp) == (4, 32, 4)
    assert "TP4 x PP2 x DP4" in s.summary()


def test_check_probe_needs_no_gpu_or_model() -> None:
    s = settings.check(
        {
            "SLURM_JOB_NODELIST": "vm",
            "SLURM_JOB_ID": "7",
            "PROBE": "1",
            "GPUS_PER_NODE": "8",
            "RAY_NODES_PER_HOST": "4",
            "TP": "4",
            "PP": "2",
        },
        "bare",
    )
    assert (s.ray_nodes, s.total_gpus, s.dp) == (4, 32, 4)
    assert s.object_store_bytes == 200_000_000


def test_check_missing_model_path() -> None:
    env = env70()
    del env["MODEL_PATH"]
    assert err(env).startswith("MODEL_PATH is not set")


def test_check_local_model_path_must_hold_a_config(tmp_path: Path) -> None:
    assert "is not a folder with config.json" in err(env70(MODEL_PATH=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    assert settings.check(env70(MODEL_PATH=str(tmp_path)), "bare").model_path == str(tmp_path)


def test_check_gpus_not_divisible_by_tp_pp() -> None:
    msg = err(env70(SLURM_JOB_NODELIST="n1,n2,n3", SLURM_GPUS_ON_NODE="2", TP="2", PP="4"))
    assert msg.startswith("6 GPUs (3 nodes x 2) do not divide by TP x PP = 2 x 4 = 8")


def test_check_tp_must_fit_a_node() -> None:
    assert err(env70(SLURM_GPUS_ON_NODE="2")).startswith("TP=4 exceeds the 2 GPUs of a node")


def test_check_no_gpus_outside_a_probe_run() -> None:
    env = env70()
    del env["SLURM_GPUS_ON_NODE"]
    assert "has no GPUs" in err(env)
    assert settings.check(env70(SLURM_GPUS_ON_NODE="", SLURM_GPUS_PER_NODE="h100:8"), "bare").gpus_per_node == 8


def test_check_container_image() -> None:
    assert err(env70(), "pyxis").startswith("CONTAINER_IMAGE is not set")
    assert "does not exist" in err(env70(CONTAINER_IMAGE="/nonexistent/verl.sif"), "apptainer")
    assert settings.check(env70(CONTAINER_IMAGE="nvcr.io#org/verl:1"), "pyxis").image == "nvcr.io#org/verl:1"
    assert settings.check(env70(CONTAINER_IMAGE="docker://org/verl:1"), "apptainer").runtime == "apptainer"


def test_check_stacking_is_for_a_probe_run_only() -> None:
    assert "PROBE=1 only" in err(env70(RAY_NODES_PER_HOST="2"))


def test_check_ports() -> None:
    assert "falls inside the worker ports" in err(env70(RAY_PORT="12000"))
    assert "are both" in err(env70(RAY_DASHBOARD_PORT="6379"))
    assert "1024-65535" in err(env70(RAY_PORT_OFFSET="60000"))
    assert "whole number" in err(env70(TP="four"))


def test_check_train_cmd_outside_a_probe_run() -> None:
    assert err(env70(TRAIN_CMD="")).startswith("TRAIN_CMD is not set")


def test_launcher_imports_only_the_standard_library() -> None:
    """In container deployments the launcher runs on the host's bare python3 (no site-packages)."""
    code = (
        "import sys, verl_recipes.cluster.cli as m; "
        "heavy = ('ray', 'pydantic', 'yaml', 'torch', 'psutil'); "
        "bad = [k for k in sys.modules if k.split('.')[0] in heavy]; "
        "assert not bad, bad; m.main(['env'])"
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "common"), "PATH": os.environ["PATH"]},
    )
    assert res.returncode == 0, res.stderr
    assert "MODEL_PATH" in res.stdout


def test_check_outside_an_allocation() -> None:
    env = env70()
    del env["SLURM_JOB_NODELIST"]
    assert "no Slurm allocation" in err(env)


def test_hostlists() -> None:
    assert settings.expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert settings.expand_hostlist("a[1-2]-ib[3-4]") == ["a1-ib3", "a1-ib4", "a2-ib3", "a2-ib4"]
    assert settings.expand_counts("72(x2),36") == [72, 72, 36]
    assert settings.gpus_from_slurm({"SLURM_GPUS_PER_NODE": "gpu:a100:4"}) == 4


def test_ports_per_slot_do_not_overlap() -> None:
    p = settings.Ports.from_env({"RAY_PORT_OFFSET": "1000"})
    assert p.gcs == 7379
    used = [v for s in range(4) for v in p.node(s).values()]
    assert len(used) == len(set(used))
    ranges = [p.workers(s, 4) for s in range(4)]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    p.check(4)


def test_nccl_interface_selection() -> None:
    names = ["lo", "eth0", "eth1", "docker0", "ib0"]
    assert in_step.match_ifnames("eth", names) == ["eth0", "eth1"]
    assert in_step.match_ifnames("^lo,docker", names) == ["eth0", "eth1", "ib0"]
    assert in_step.match_ifnames("=eth1", names) == ["eth1"]
    assert in_step.node_ip({"NCCL_SOCKET_IFNAME": "lo"}) == ("127.0.0.1", "lo")
    with pytest.raises(RecipeError, match="matches no interface"):
        in_step.node_ip({"NCCL_SOCKET_IFNAME": "nosuchif"})
    ip, iface = in_step.node_ip({})
    assert iface is None and socket.inet_aton(ip)


def test_plan_lines() -> None:
    s = settings.check(env70(CONTAINER_IMAGE="nvcr.io#org/verl:1"), "pyxis")
    p = steps.StepBuilder(s, "/opt/venv/bin/python")
    head = p.node("n1", 0, None).argv
    worker = p.node("n3", 0, "10.0.0.1:6379").argv
    for argv in (head, worker, p.driver("10.0.0.1:6379").argv, p.verify().argv, p.reap().argv):
        assert argv[:2] == ["srun", "--overlap"]
        assert "--container-image=nvcr.io#org/verl:1" in argv and "--container-name=verl-recipes-42" in argv
        assert f"--container-mounts={ROOT}:{ROOT}" in argv and f"--container-workdir={ROOT}" in argv
    assert "--nodelist=n1" in head and "--head" in head and "--dashboard-host=127.0.0.1" in head
    assert "--nodelist=n3" in worker and "--address=10.0.0.1:6379" in worker
    assert p.verify().argv[-3:] == ["verify", "--recipe", "70b-3d"]
    probe = steps.StepBuilder(settings.check(env70(PROBE="1", GPUS_PER_NODE="8"), "bare"), "python3")
    assert probe.verify().argv[-1] == "verify"  # no --recipe: a node without a GPU passes
    assert "--probe" in probe.driver("10.0.0.1:6379").argv
    a = steps.StepBuilder(settings.check(env70(CONTAINER_IMAGE="docker://org/verl:1"), "apptainer"), "python3")
    line = a.node("n2", 0, "10.0.0.1:6379").argv
    i = line.index("--")
    assert line[i + 1 : i + 4] == ["apptainer", "exec", "--nv"] and "docker://org/verl:1" in line


def test_step_env_keeps_token_auth(tmp_path: Path) -> None:
    s = settings.check(env70(), "bare")
    env = steps.step_env(s, {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "leak"}, tmp_path / "auth_token")
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "auth_token")
    assert "RAY_AUTH_TOKEN" not in env and env["NNODES"] == "4"


def test_new_token_is_private(tmp_path: Path) -> None:
    path = launcher._new_token(tmp_path / "job")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert re.fullmatch(r"[0-9a-f]{64}", path.read_text())


def test_leftovers_finds_marked_and_session_processes() -> None:
    """Real processes: one with the job marker, one in a recorded session, one unrelated."""
    marked = subprocess.Popen(["sleep", "60"], env={**os.environ, procs.RAY_JOB_ENV: "t1"})
    session = subprocess.Popen(["sleep", "60"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        found = in_step.leftovers("t1", {os.getsid(session.pid)})
        assert marked.pid in found and session.pid in found
        assert other.pid not in found and os.getpid() not in found
        assert marked.pid not in in_step.leftovers("t2", set())
    finally:
        for p in (marked, session, other):
            p.kill()
            p.wait()


# --- the templates through bash ------------------------------------------------------------------


@pytest.mark.parametrize("script", SHELL, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_syntax(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); `nox -s lint` runs it")
    res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def dry_run(template: Path, tmp_path: Path, **kw: str) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    env = base_env(
        DRY_RUN="1",
        SLURM_JOB_NODELIST="gpu[01-04]",
        SLURM_JOB_ID="99",
        SLURM_GPUS_ON_NODE="8",
        SLURM_SUBMIT_DIR=str(ROOT),
        MODEL_PATH=str(model),
        VENV=sys.prefix,
        HOST_PYTHON=sys.executable,
        JOB_DIR=str(tmp_path / "job"),
    )
    env.update(kw)
    return subprocess.run(["bash", str(template)], env=env, capture_output=True, text=True, cwd=ROOT)


def srun_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("srun ")]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "bare"])
def test_dry_run_prints_the_srun_lines(runtime: str, tmp_path: Path) -> None:
    image = tmp_path / "verl.img"
    image.write_text("")
    res = dry_run(T70 / f"{runtime}.sbatch", tmp_path, CONTAINER_IMAGE=str(image))
    assert res.returncode == 0, res.stderr
    lines = srun_lines(res.stdout)
    # verify on all 4 nodes, the head, 3 workers, the driver, the reap on all 4 nodes
    assert len(lines) == 7, res.stdout
    assert "--nodes=4" in lines[0] and "verify --recipe 70b-3d" in lines[0]
    assert "--nodelist=gpu01" in lines[1] and " --head " in lines[1]
    workers = [re.search(r"--nodelist=(\S+)", line) for line in lines[2:5]]
    assert [m.group(1) for m in workers if m] == ["gpu02", "gpu03", "gpu04"]
    assert all("--address=HEAD_IP:6379" in line for line in lines[2:5])
    train = "verl-recipes train 70b-3d"
    if runtime != "bare":
        train = '"$CONTAINER_PYTHON" -m verl_recipes.cli train 70b-3d'

    assert " driver " in lines[5] and train in lines[5], lines[5]
    assert "trainer.resume_mode=auto" in lines[5]
    assert " reap " in lines[6] and "--nodes=4" in lines[6]
    for line in lines:
        assert line.startswith("srun --overlap ")
        if runtime == "pyxis":
            assert f"--container-image={image}" in line and "--container-name=verl-recipes-99" in line
        elif runtime == "apptainer":
            assert f" -- apptainer exec --nv --bind {ROOT} " in line and str(image) in line
        else:
            assert "container" not in line and "apptainer" not in line
    assert "RAY_AUTH_MODE=token" in res.stdout


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_dry_run_without_image_fails_in_one_line(runtime: str, tmp_path: Path) -> None:
    res = dry_run(T70 / f"{runtime}.sbatch", tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    kind = ".sqsh file or a registry image" if runtime == "pyxis" else ".sif file or a docker:// URI"
    want = f"error: CONTAINER_IMAGE is not set; set it to a {kind} for {runtime}"
    assert res.stderr.strip().splitlines() == [want]


def test_dry_run_13b_single_node(tmp_path: Path) -> None:
    res = dry_run(T13 / "bare.sbatch", tmp_path, SLURM_JOB_NODELIST="gpu07", SLURM_GPUS_ON_NODE="2", SLURM_JOB_ID="45")
    assert res.returncode == 0, res.stderr
    lines = srun_lines(res.stdout)
    assert len(lines) == 4  # verify, head, driver, reap
    # job 45 -> port block 10000 + (45 mod 20) x 1000
    assert "--port=15000" in lines[1] and "--min-worker-port=15100" in lines[1]
    assert "verl-recipes train 13b-fsdp" in lines[2]


def test_dry_run_refuses_a_job_the_planner_says_does_not_fit_the_allocations_gpu(tmp_path: Path) -> None:
    """The layout rules pass 13B on 2 GPUs; the planner, asked about the GPU the template is given
    (GPU=, else NVML's name on the node), refuses it on 40 GB cards, naming the variant that fits.
    About 10 s: the job and each variant are composed against verl's Hydra config, as `plan` does."""
    res = dry_run(
        T13 / "bare.sbatch",
        tmp_path,
        SLURM_JOB_NODELIST="gpu07",
        SLURM_GPUS_ON_NODE="2",
        SLURM_JOB_ID="45",
        GPU="a100-40g",
    )
    assert res.returncode == 2 and not srun_lines(res.stdout), res.stdout[-2000:]
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the planner predicts 13b-fsdp on 1 x 2 GPU(s) does not fit"), err
    assert "a100-40g (--gpu a100-40g)" in err[0] and "--variant 40gib does" in err[0], err[0]


# --- real jobs on the one-node Slurm -------------------------------------------------------------


def _slurm_reason() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch is not installed: run `bash .ci/slurm-up.sh` (CI does)"
    res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if res.returncode != 0 or not any(s.startswith(("idle", "mixed")) for s in res.stdout.split()):
        return "the local Slurm is not up (no idle node in sinfo): run `bash .ci/slurm-up.sh`"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed in this Python; the probe run runs Ray from it"
    return None


_REASON = _slurm_reason()
needs_slurm = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
# The CI machine's one node: 2 CPUs, no GRES. These override the templates' #SBATCH lines.
ONE_NODE = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=2000", "--time=10"]


def sbatch(template: Path, tmp_path: Path, env: dict[str, str], wait: bool = True) -> tuple[int, str, Path]:
    """Submit the template; with `wait`, the code is the job's exit code once it has ended (as
    `sbatch --wait` gives it), else sbatch's own."""
    out = tmp_path / "job.out"
    args = ["sbatch", "--parsable", *ONE_NODE, f"--output={out}"]
    full = base_env(VENV=sys.prefix, JOB_DIR=str(tmp_path / "job"), RAY_DASHBOARD="0", **env)
    res = subprocess.run([*args, str(template)], env=full, capture_output=True, text=True, cwd=ROOT)
    job = res.stdout.strip().split(";")[0]
    assert job.isdigit(), res.stderr
    return (job_exit_code(job) if wait else res.returncode), job, out


def job_exit_code(job: str, timeout: float = 600) -> int:
    """Wait for the job to end; its exit code as `sbatch --wait` returns it (128 + the signal where
    a signal ended it). `sbatch --wait` itself looks at 2, 10, 42, 74 s after submitting: a job of
    3 s took 10 s there, one of 20 s 42 s. This looks every half second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
        fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f)
        if fields.get("JobState") in ENDED:
            code, sig = (int(x) for x in fields["ExitCode"].split(":"))
            return 128 + sig if sig else code
        time.sleep(0.5)
    pytest.fail(f"job {job} did not end within {timeout}s ({job_state(job) or 'gone'})")


def ray_left(job: str) -> list[str]:
    """This job's Ray processes still alive: its temp dir on the command line or its marker."""
    res = subprocess.run(
        ["pgrep", "-af", "raylet|gcs_server|ray start|default_worker|ray::"], capture_output=True, text=True
    )
    left = [line for line in res.stdout.splitlines() if f"/tmp/ray-{job}" in line]
    marker = f"{procs.RAY_JOB_ENV}={job}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "environ").read_bytes().split(b"\0"):
                    left.append(f"{d.name} (marked)")
            except OSError:
                pass
    return left


def stepds(job: str) -> list[str]:
    """The slurmstepd processes of a job's steps on this node (`slurmstepd: [JOB.STEP]`)."""
    res = subprocess.run(["pgrep", "-af", rf"^slurmstepd: \[{job}\."], capture_output=True, text=True)
    return res.stdout.splitlines()


# States after which a job never runs again. A requeue passes through REQUEUED (and, between
# its steps, states plain `squeue` leaves out), so "not listed" alone must not mean "ended".
ENDED = {
    *("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"),
    *("PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"),
}


def job_state(job: str) -> str:
    """The job's state in any state (`--states=all`), or "" once slurmctld no longer knows it.
    A failed squeue call (slurmctld busy) is retried rather than read as "ended"."""
    for _ in range(10):
        res = subprocess.run(["squeue", "-h", "-j", job, "--states=all", "-o", "%T"], capture_output=True, text=True)
        if res.returncode == 0:
            return res.stdout.strip()
        if "Invalid job id" in res.stderr:
            return ""
        time.sleep(1)
    raise AssertionError(f"squeue kept failing for job {job}: {res.stderr.strip()}")


def job_ended(job: str, settle: float = 3.0) -> bool:
    """True when the job is gone or in an ended state, and still so `settle` seconds later:
    a requeue is ended for an instant between its run and its next one."""
    deadline = time.monotonic() + settle
    while True:
        state = job_state(job)
        if state and state not in ENDED:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.5)


def wait_for(path: Path, pattern: str, job: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if re.search(pattern, text, re.M):
            return text
        if job_ended(job, settle=0):
            text = path.read_text(errors="replace") if path.exists() else ""
            if re.search(pattern, text, re.M):
                return text
            if job_ended(job):
                pytest.fail(f"job {job} ended ({job_state(job) or 'gone'}) before {pattern!r}:\n{text}")
        time.sleep(1)
    pytest.fail(f"no {pattern!r} in {path} after {timeout}s:\n{path.read_text(errors='replace')}")


@pytest.fixture
def cancel_on_exit() -> Iterator[list[str]]:
    jobs: list[str] = []
    yield jobs
    for job in jobs:
        subprocess.run(["scancel", job], capture_output=True)


@pytest.mark.slurm
@needs_slurm
@pytest.mark.slow
def test_probe_run_70b_bare(tmp_path: Path) -> None:
    """The 70b template, as a probe run: verify, head, two stacked workers, probe on each, clean exit."""
    code, job, out = sbatch(
        T70 / "bare.sbatch",
        tmp_path,
        {
            "PROBE": "1",
            "GPUS_PER_NODE": "8",
            "RAY_NODES_PER_HOST": "3",
            "RAY_PORT_OFFSET": "1000",
            "RAY_READY_TIMEOUT_S": "400",
        },
    )
    text = out.read_text(errors="replace")
    assert code == 0, text
    assert "3 Ray nodes x 8 GPUs = 24 (TP4 x PP2 x DP3)" in text
    # verify ran on the node without --recipe (a probe run's node has no GPU) and passed, or the job had stopped
    assert re.search(r"verify on 1 node\(s\): srun .* -m verl_recipes\.cli verify$", text, re.M), text
    assert re.search(r"Ray ready after [\d.]+s: 3/3 nodes, 24/24 GPUs", text), text
    nodes = re.findall(r"probe node (\w+) host (\S+) ip \S+ pid \d+ GPUs 8", text)
    assert len(nodes) == 3 and len({n for n, _ in nodes}) == 3, text
    assert "probe ok: 3/3 Ray nodes answered on 1 host(s)" in text
    assert "reap on" in text and "nothing left" in text and "teardown done" in text
    assert ray_left(job) == []
    assert not Path(f"/tmp/ray-{job}").exists()
    assert not (tmp_path / "job" / "auth_token").exists()
    assert oct((tmp_path / "job").stat().st_mode & 0o777) == "0o700"
    assert len(list((tmp_path / "job" / "logs").glob("ray-*.log"))) == 3


def _one_error_line(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


@pytest.mark.slurm
@needs_slurm
def test_bad_tp_pp_fails_before_ray(tmp_path: Path) -> None:
    code, job, out = sbatch(
        T70 / "bare.sbatch",
        tmp_path,
        {"PROBE": "1", "GPUS_PER_NODE": "2", "RAY_NODES_PER_HOST": "3", "TP": "2", "PP": "2"},
    )
    text = out.read_text(errors="replace")
    assert code == 2, text
    assert _one_error_line(text) == (
        "error: 6 GPUs (3 nodes x 2) do not divide by TP x PP = 2 x 2 = 4; change TP/PP or the node or GPU count"
    )
    assert text.strip().count("\n") == 0, text
    assert not (tmp_path / "job").exists() and ray_left(job) == []


@pytest.mark.slurm
@needs_slurm
def test_missing_model_path_fails_before_ray(tmp_path: Path) -> None:
    code, job, out = sbatch(T13 / "bare.sbatch", tmp_path, {"GPUS_PER_NODE": "2"})
    text = out.read_text(errors="replace")
    assert code == 2, text
    assert _one_error_line(text).startswith("error: MODEL_PATH is not set")
    assert not (tmp_path / "job").exists() and ray_left(job) == []


@pytest.mark.slurm
@needs_slurm
def test_failed_verify_stops_the_job_before_ray(tmp_path: Path) -> None:
    """A GPU recipe on a node without GPUs: `verify --recipe` fails on the node, Ray never starts."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code, job, out = sbatch(T13 / "bare.sbatch", tmp_path, {"GPUS_PER_NODE": "2", "MODEL_PATH": str(model)})
    text = out.read_text(errors="replace")
    assert code == 2, text
    assert "verify --recipe 13b-fsdp" in text
    assert _one_error_line(text).startswith("error: `verl-recipes verify` failed")
    assert "starting the Ray head" not in text and ray_left(job) == []


@pytest.mark.slurm
@needs_slurm
@pytest.mark.slow
def test_usr1_requeues_and_scancel_tears_down(tmp_path: Path, cancel_on_exit: list[str]) -> None:
    """Near the time limit (SIGUSR1) the job stops Ray and requeues itself; scancel of the rerun
    stops Ray too. Either way nothing of the job's Ray is left on the node."""
    _, job, out = sbatch(
        T13 / "bare.sbatch",
        tmp_path,
        {"PROBE": "1", "GPUS_PER_NODE": "2", "PROBE_HOLD_S": "600", "VERIFY": "0"},
        wait=False,
    )
    cancel_on_exit.append(job)
    wait_for(out, r"holding Ray up", job)
    assert ray_left(job), "no Ray process seen while the job holds Ray: the checks below would prove nothing"
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    wait_for(out, r"requeueing job", job, timeout=120)
    deadline = time.monotonic() + 120
    while job_state(job) != "PENDING" and time.monotonic() < deadline:
        time.sleep(1)
    assert job_state(job) == "PENDING", f"job {job} is {job_state(job) or 'gone'} after its requeue, not PENDING"
    assert ray_left(job) == []
    # Every step of the first run has ended before the job is requeued: the rerun numbers its steps
    # from 0 again, and a slurmstepd of the first run still ending takes the new step's place.
    assert stepds(job) == [], "slurmstepds of the first run outlive its requeue"
    # Slurm holds a requeued job back for a while; start it now, but not within the second the node
    # revoked the first run's credential (before PENDING): slurmd refuses a credential no newer than
    # the revocation, to the second, and the job would end FAILED ("Job credential revoked").
    time.sleep(1.5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
    text = wait_for(out, r"requeued run 1[\s\S]*holding Ray up", job, timeout=400)
    assert "trainer.resume_mode=auto" in text
    subprocess.run(["scancel", job], check=True)
    deadline = time.monotonic() + 90
    while not job_ended(job, settle=0) and time.monotonic() < deadline:
        time.sleep(1)
    assert job_ended(job), f"job {job} still {job_state(job)} after scancel"
    time.sleep(2)
    assert ray_left(job) == [], out.read_text(errors="replace")
    assert not (tmp_path / "job" / "auth_token").exists()


def test_check_applies_trains_batch_rule_over_data_parallel_ranks() -> None:
    """3 nodes x 8 GPUs divide by TP4 x PP2, but leave 3 data-parallel ranks for 70b-3d's batch of
    32: `train` would refuse it on the head after the queue wait, so the check refuses it first."""
    msg = err(env70(SLURM_JOB_NODELIST="n1,n2,n3"))
    assert msg.startswith("data.train_batch_size x rollout.n = 32 is not a multiple of 3"), msg
    # the batch a --set in TRAIN_CMD gives is the one judged
    ok = settings.check(
        env70(
            SLURM_JOB_NODELIST="n1,n2,n3",
            TRAIN_CMD="verl-recipes train 70b-3d --set data.train_batch_size=48 "
            "--set actor_rollout_ref.actor.ppo_mini_batch_size=48",
        ),
        "bare",
    )
    assert ok.dp == 3
    # TP/PP that the recipe's own layout does not use are named with the recipe's
    msg = err(env70(TP="8", PP="1"))
    assert "70b-3d trains with Megatron TP4 x PP2" in msg and "set TP=4 PP=2" in msg
    assert settings.check(env70(TP="8", PP="1", TRAIN_CMD="verl-recipes train 70b-3d --variant tp8pp1"), "bare").tp == 8


def test_dry_run_refuses_what_train_would_refuse(tmp_path: Path) -> None:
    res = dry_run(T70 / "bare.sbatch", tmp_path, SLURM_JOB_NODELIST="gpu0[1-3]")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "error: data.train_batch_size x rollout.n = 32 is not a multiple of 3 (verl's minimal batch: the GPUs, "
        "or Megatron DP x micro-batch); change the batch or the GPUs"
    ]
