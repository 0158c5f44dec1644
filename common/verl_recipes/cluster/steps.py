"""The Slurm job steps of a launch as srun argv lists, for one runtime (bare, pyxis, Apptainer).

No side effects: the launcher runs these steps and a dry run prints them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_recipes.cluster.settings import Settings, looks_like_path

MODULE = "verl_recipes.cluster"


@dataclass(frozen=True)
class Step:
    """One Slurm job step: its name (for logs and scancel), where it runs, and the srun argv."""

    name: str
    argv: list[str]
    log: Path | None = None


class StepBuilder:
    """Turns Settings into srun argv lists for one runtime; no side effects (dry-run prints them)."""

    def __init__(self, s: Settings, python: str) -> None:
        self.s = s
        self.python = python  # the python that runs `-m verl_recipes...` inside a step

    @property
    def logs(self) -> Path:
        return self.s.job_dir / "logs"

    def _srun(self, name: str, hosts: Sequence[str], log: Path | None = None, label: bool = False) -> list[str]:
        argv = [
            "srun",
            "--overlap",
            f"--job-name={name}",
            f"--nodes={len(hosts)}",
            f"--ntasks={len(hosts)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}",
            "--kill-on-bad-exit=1",
        ]
        if log is not None:
            argv.append(f"--output={log}")
        if label:
            argv.append("--label")
        if self.s.runtime == "pyxis":
            mounts = [m if ":" in m else f"{m}:{m}" for m in self.mounts()]
            argv += [
                f"--container-image={self.s.image}",
                f"--container-name=verl-recipes-{self.s.job_id}",
                f"--container-mounts={','.join(mounts)}",
                f"--container-workdir={self.s.root}",
            ]
        argv.append("--")
        if self.s.runtime == "apptainer":
            argv += ["apptainer", "exec", "--nv"]
            for m in self.mounts():
                argv += ["--bind", m]
            argv += ["--pwd", str(self.s.root), str(self.s.image)]
        return argv

    def mounts(self) -> list[str]:
        """The checkout, the job folder and a local model folder, plus CONTAINER_MOUNTS."""
        paths = [self.s.root, self.s.job_dir]
        if self.s.model_path and looks_like_path(self.s.model_path):
            paths.append(Path(self.s.model_path).expanduser().resolve())
        out: list[str] = []
        for p in paths:
            if not any(p == Path(q) or Path(q) in p.parents for q in out):
                out.append(str(p))
        return out + list(self.s.mounts)

    def _me(self, *args: str) -> list[str]:
        return [self.python, "-m", MODULE, *args]

    def verify(self) -> Step:
        cmd = [self.python, "-m", "verl_recipes.cli", "verify"]
        if self.s.recipe and not self.s.probe:
            cmd += ["--recipe", self.s.recipe]
        return Step("verify", self._srun("verify", self.s.hosts, label=True) + cmd)

    def node(self, host: str, slot: int, head_address: str | None) -> Step:
        role = "head" if head_address is None else "worker"
        name = f"ray-{role}"
        log = self.logs / f"{name}-{host}-{slot}.log"
        lo, hi = self.s.ports.workers(slot, self.s.ray_nodes_per_host)
        ray_args = [f"--{k}={v}" for k, v in self.s.ports.node(slot).items()]
        ray_args += [
            f"--min-worker-port={lo}",
            f"--max-worker-port={hi}",
            f"--temp-dir={self.s.ray_tmpdir}",
            "--disable-usage-stats",
        ]
        if self.s.object_store_bytes:
            ray_args.append(f"--object-store-memory={self.s.object_store_bytes}")
        if head_address is None:
            ray_args += [
                "--head",
                f"--port={self.s.ports.gcs}",
                f"--ray-client-server-port={self.s.ports.client}",
                f"--include-dashboard={str(self.s.dashboard).lower()}",
                f"--dashboard-host={self.s.dashboard_host}",
                f"--dashboard-port={self.s.ports.dashboard}",
            ]
        else:
            ray_args.append(f"--address={head_address}")
        me = self._me(
            "node",
            f"--slot={slot}",
            f"--slots={self.s.ray_nodes_per_host}",
            f"--gpus={self.s.gpus_per_node}",
            f"--nofile={self.s.nofile}",
            f"--job-dir={self.s.job_dir}",
            f"--temp-dir={self.s.ray_tmpdir}",
            f"--job={self.s.job_id}",
        )
        if head_address is None:
            me.append("--write-head")
        return Step(name, [*self._srun(name, [host], log=log), *me, "--", *ray_args], log)

    def driver(self, head_address: str) -> Step:
        me = self._me(
            "driver",
            f"--address={head_address}",
            f"--nodes={self.s.ray_nodes}",
            f"--gpus={self.s.total_gpus}",
            f"--timeout={self.s.ready_timeout_s}",
            f"--nofile={self.s.nofile}",
        )
        if self.s.probe:
            me += ["--probe", f"--hold={self.s.hold_s}"]
        else:
            me += ["--", "bash", "-c", self.s.train_cmd or "exit 2"]
        return Step("ray-driver", self._srun("ray-driver", [self.s.hosts[0]]) + me)

    def reap(self) -> Step:
        return Step(
            "ray-reap",
            self._srun("ray-reap", self.s.hosts, label=True)
            + self._me("reap", f"--temp-dir={self.s.ray_tmpdir}", f"--job={self.s.job_id}"),
        )

    def node_slots(self) -> list[tuple[str, int]]:
        """(host, slot) of every Ray node; (hosts[0], 0) is the head."""
        return [(h, s) for h in self.s.hosts for s in range(self.s.ray_nodes_per_host)]


def step_env(s: Settings, base: Mapping[str, str], token_path: Path) -> dict[str, str]:
    """The environment srun passes to every step (srun exports the launcher's environment)."""
    env = dict(base)
    env.update(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray drains a node it stops (SIGTERM) so that Ray Serve can move work off it; the
            # teardown stops every node of the job at once, so there is nothing to move, and the
            # drain's call to the GCS, stopping too, only waits out the timeout (about 6 s a stop).
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": base.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0"),
            "PYTHONUNBUFFERED": "1",
            "NNODES": str(s.ray_nodes),
            "GPUS_PER_NODE": str(s.gpus_per_node),
            "VERL_RECIPES_ROOT": str(s.root),
        }
    )
    env.pop("RAY_AUTH_TOKEN", None)  # the file is the one source of the token
    env.pop("RAY_ADDRESS", None)  # set for the driver once the head is up; `ray start` must not see one
    if s.runtime != "bare":
        # The launcher's checkout is mounted in the container: steps run the same code.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(s.root / "common"), base.get("PYTHONPATH")) if p)
    return env
