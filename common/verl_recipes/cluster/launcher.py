"""The batch step: run verify, the Ray head, the workers and the driver as job steps, and tear down.

Every exit path (the driver's end, an error, scancel, pre-emption, the time limit's SIGUSR1) goes
through `Launcher.teardown`: the token goes first, then every step gets SIGTERM and, after
RAY_STOP_GRACE_S, SIGKILL, and a last step on every node reaps what this job's Ray left. Near the
time limit the job requeues itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.cluster.settings import Settings
from verl_recipes.cluster.steps import Step, StepBuilder, step_env

# What `ray start` prints once its node has registered with the GCS (Ray 2.60's scripts.py).
STARTED = "Ray runtime started"


class _Stop(Exception):
    """Raised from a signal handler so the launcher unwinds into its teardown."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _tail(path: Path | None, n: int = 15) -> str:
    if path is None or not path.is_file():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-n:]
    return "\n".join(f"    {line}" for line in lines)


_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"ray-slurm [+{time.monotonic() - _T0:.0f}s]: {msg}", flush=True)


class Launcher:
    """Runs the steps: verify, head, workers, driver; tears everything down on any exit."""

    def __init__(self, s: Settings, builder: StepBuilder, env: dict[str, str], token_path: Path) -> None:
        self.s, self.p, self.env, self.token_path = s, builder, env, token_path
        self.procs: list[tuple[Step, subprocess.Popen[bytes]]] = []

    def start(self, step: Step) -> subprocess.Popen[bytes]:
        if step.log:
            step.log.unlink(missing_ok=True)  # steps append (--open-mode=append); STARTED must be new
        proc = subprocess.Popen(step.argv, env=self.env, stdin=subprocess.DEVNULL)
        self.procs.append((step, proc))
        return proc

    def _dead_node(self) -> tuple[Step, int] | None:
        for step, proc in self.procs:
            rc = proc.poll()
            if step.name.startswith("ray-") and step.name != "ray-driver" and rc is not None:
                return step, rc
        return None

    def _fail_node(self, step: Step, rc: int) -> RecipeError:
        tail = _tail(step.log)
        return RecipeError(
            f"{step.name} step exited {rc} before the run finished; log {step.log}" + (f"\n{tail}" if tail else "")
        )

    def run_verify(self) -> None:
        if not self.s.verify:
            say("VERIFY=0: skipping `verl-recipes verify` on the nodes")
            return
        step = self.p.verify()
        say(f"verify on {len(self.s.hosts)} node(s): {shlex.join(step.argv)}")
        rc = subprocess.run(step.argv, env=self.env, stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            raise RecipeError(
                f"`verl-recipes verify` failed (exit {rc}) on at least one node; "
                "fix what it printed above, or set VERIFY=0 to skip it knowingly"
            )

    def wait_started(self, started: Sequence[tuple[Step, subprocess.Popen[bytes]]]) -> None:
        """Wait until each node step's log says its Ray node is up.

        `ray start` prints STARTED once its raylet has registered with the GCS, and it gives the
        raylet a fixed 30 s for that; starting the next node on a busy host (a probe run stacks
        several) only after the previous one is up keeps that from timing out.
        """
        deadline = time.monotonic() + self.s.ready_timeout_s
        pending = list(started)
        while pending:
            for step, proc in list(pending):
                rc = proc.poll()
                if rc is not None:
                    raise self._fail_node(step, rc)
                if step.log and step.log.is_file() and STARTED in step.log.read_text(errors="replace"):
                    pending.remove((step, proc))
            if pending and time.monotonic() > deadline:
                logs = ", ".join(str(st.log) for st, _ in pending)
                raise RecipeError(
                    f"{len(pending)} Ray node(s) not up within RAY_READY_TIMEOUT_S="
                    f"{self.s.ready_timeout_s}s; logs: {logs}"
                )
            time.sleep(0.5)

    def run(self) -> int:
        self.run_verify()
        head_file = self.s.job_dir / "head.json"
        head_file.unlink(missing_ok=True)
        slots = self.p.node_slots()
        head = self.p.node(*slots[0], head_address=None)
        say(f"starting the Ray head on {slots[0][0]} (log {head.log})")
        self.wait_started([(head, self.start(head))])
        info = json.loads(head_file.read_text())
        address = f"{info['ip']}:{info['port']}"
        say(f"Ray head is up at {address}; starting {len(slots) - 1} worker node(s)")
        # One wave per slot: different hosts start together, stacked slots of a host one by one.
        for slot in range(self.s.ray_nodes_per_host):
            wave = [self.p.node(h, sl, head_address=address) for h, sl in slots[1:] if sl == slot]
            if wave:
                self.wait_started([(st, self.start(st)) for st in wave])
                say(f"{len(wave)} worker node(s) up ({', '.join(h for h, sl in slots[1:] if sl == slot)}, slot {slot})")
        self.env["RAY_ADDRESS"] = address
        driver = self.start(self.p.driver(address))
        while True:
            rc = driver.poll()
            if rc is not None:
                say(f"driver step exited {rc}")
                return rc
            dead = self._dead_node()
            if dead:
                raise self._fail_node(*dead)
            time.sleep(1)

    def _step_ids(self, names: set[str]) -> list[str]:
        """Slurm step ids (job.step) of this job's running steps with these names."""
        res = subprocess.run(
            ["squeue", "-h", "-s", "-j", self.s.job_id, "-o", "%i %j"], capture_output=True, text=True, check=False
        )
        ids = []
        for line in res.stdout.splitlines():
            sid, _, name = line.strip().partition(" ")
            if name in names:
                ids.append(sid)
        return ids

    def _wait(self, procs: Sequence[subprocess.Popen[bytes]], seconds: float) -> list[subprocess.Popen[bytes]]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.5)
        return [p for p in procs if p.poll() is None]

    def teardown(self) -> None:
        """Drop the token, stop every step, reap what is left on every node.

        `scancel --signal=TERM <step>` reaches every process of a step, and `ray start --block`
        stops its node cleanly on SIGTERM; SIGTERM to srun itself would make srun kill the step
        outright. What is still running after RAY_STOP_GRACE_S gets SIGKILL.
        """
        # First what must not outlive the job, in case Slurm's KillWait cuts the rest short.
        self.token_path.unlink(missing_ok=True)
        (self.s.job_dir / "head.json").unlink(missing_ok=True)
        live = [(st, p) for st, p in self.procs if p.poll() is None]
        if live:
            names = {st.name for st, _ in live}
            ids = self._step_ids(names)
            say(f"stopping {len(live)} step(s) ({', '.join(sorted(names))}) with SIGTERM")
            if ids:
                subprocess.run(["scancel", "--signal=TERM", *ids], capture_output=True, check=False)
            else:  # squeue unavailable (job ending): srun forwards and then kills the step itself
                for _, p in live:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
            left = self._wait([p for _, p in live], self.s.stop_grace_s)
            if left:
                ids = self._step_ids(names)
                say(
                    f"{len(left)} step(s) still running after RAY_STOP_GRACE_S={self.s.stop_grace_s}s; "
                    f"killing {' '.join(ids) or 'their srun'}"
                )
                if ids:
                    subprocess.run(["scancel", "--signal=KILL", *ids], capture_output=True, check=False)
                for p in self._wait(left, 10):
                    p.kill()
                    p.wait()
        if self.procs:
            reap = self.p.reap()
            try:
                subprocess.run(reap.argv, env=self.env, stdin=subprocess.DEVNULL, timeout=60, check=False)
            except subprocess.TimeoutExpired:
                say("the reap step did not finish in 60s; Slurm kills what is left when the job ends")
        say("teardown done")


def _new_token(job_dir: Path) -> Path:
    """A fresh token in a file only this user can read, in a folder only this user can list."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job_dir.chmod(0o700)
    (job_dir / "logs").mkdir(exist_ok=True)
    path = job_dir / "auth_token"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def launch(s: Settings, env: Mapping[str, str]) -> int:
    python = sys.executable if s.runtime == "bare" else s.container_python
    builder = StepBuilder(s, python)
    token_path = s.job_dir / "auth_token"
    say(s.summary())
    if env.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
        say(f"requeued run {env['SLURM_RESTART_COUNT']}: TRAIN_CMD resumes through trainer.resume_mode=auto")
    if s.dry_run:
        senv = step_env(s, {}, token_path)
        print("env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(senv.items())))
        slots = builder.node_slots()
        head_address = f"HEAD_IP:{s.ports.gcs}"
        steps = [builder.verify(), builder.node(*slots[0], head_address=None)]
        steps += [builder.node(h, sl, head_address=head_address) for h, sl in slots[1:]]
        steps += [builder.driver(head_address), builder.reap()]
        for st in steps:
            if st.name != "verify" or s.verify:
                print(shlex.join(st.argv))
        return 0

    token_path = _new_token(s.job_dir)
    launcher = Launcher(s, builder, step_env(s, env, token_path), token_path)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Stop(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    requeue = False
    try:
        rc = launcher.run()
    except _Stop as e:
        say(f"received {e}: stopping Ray on every node")
        rc = 128 + e.signum
        # The templates ask for SIGUSR1 two minutes before the time limit (--signal=B:USR1@120).
        requeue = e.signum == signal.SIGUSR1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # a second scancel must not cut the teardown short
        launcher.teardown()
    if requeue:
        say(f"time limit near: requeueing job {s.job_id}; the next run resumes through trainer.resume_mode=auto")
        res = subprocess.run(["scontrol", "requeue", s.job_id], capture_output=True, text=True, check=False)
        if res.returncode:
            say(f"scontrol requeue failed: {res.stderr.strip()} (submit with --requeue to allow it)")
    return rc
