"""Ray on a Slurm allocation: validate, start Ray on every node, run the trainer, tear down.

The sbatch templates under ``recipes/*/slurm/`` are thin: they set the recipe's variables and call
``python -m verl_recipes.ray_cluster launch`` (also ``verl-recipes ray-slurm launch``). The
launcher runs in the batch step on the first node and drives everything else as Slurm job steps,
so Slurm tracks, signals and accounts every process:

1. ``check``: the allocation and variables are validated before anything starts (no MODEL_PATH,
   GPUs not divisible by TP x PP, no container image, ports that collide); one line says what to
   change and the job exits 2.
2. ``verl-recipes verify [--recipe ID]`` runs on every node (one task per node); a failure ends
   the job before Ray starts. Rehearsal omits ``--recipe`` so a node without a GPU passes.
3. The Ray head starts on the first node, then one worker per other node, each as
   ``srun --overlap --nodes=1 --ntasks=1 --nodelist=<node>`` (``--overlap`` so the steps share
   the node's CPUs and GPUs with each other and with the trainer step).
4. A driver step on the head polls Ray until every expected node and GPU has registered (with a
   deadline, no fixed sleeps), then runs TRAIN_CMD there; rehearsal runs a probe instead.
5. On exit, error, ``scancel`` or pre-emption the steps get SIGTERM (``ray start --block`` stops
   its own processes on SIGTERM), stragglers are cancelled by step id, and a last step on every
   node kills whatever this job's Ray left (a scoped ``ray stop``: plain ``ray stop`` would also
   kill other jobs' Ray on a shared node).

Ray token authentication stays on across nodes: a fresh token per run in a job-private file
(mode 600, folder 700, under JOB_DIR, which every node must see) reaches every process through
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``. The dashboard binds to 127.0.0.1 unless
RAY_DASHBOARD_HOST says otherwise.

CPU rehearsal (REHEARSAL=1) needs no GPU: nodes advertise GPUS_PER_NODE logical GPUs to Ray, the
trainer is replaced by a probe (a Ray task pinned to each node with NodeAffinitySchedulingStrategy
that reports its host and node id), and RAY_NODES_PER_HOST may start several Ray nodes on one host,
each its own srun step with its own ports. Debian's Slurm cannot run several slurmd on one host,
so the CI rehearses multi-node this way: one Slurm node, several Ray nodes.

This module imports only the standard library at load time: in container deployments the launcher
runs on the host's python3 with ``PYTHONPATH=<checkout>/common`` while Ray runs in the container.
Variables are listed in ``ENV_HELP`` (``python -m verl_recipes.ray_cluster env``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import re
import resource
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, layout

RUNTIMES = ("bare", "pyxis", "apptainer")
MODULE = "verl_recipes.ray_cluster"
# The environment marker every Ray process of a job inherits; `reap` matches on it.
MARKER = "VERL_RECIPES_RAY_JOB"
# What `ray start` prints once its node has registered with the GCS (Ray 2.60's scripts.py).
STARTED = "Ray runtime started"

ENV_HELP = """\
Required
  MODEL_PATH                HF checkpoint folder every node sees (not needed with REHEARSAL=1)
  CONTAINER_IMAGE           pyxis: .sqsh file or registry image; apptainer: .sif file or docker:// URI
Shape
  TP, PP                    tensor / pipeline parallel sizes (default 1); GPUs must divide by TP x PP
  GPUS_PER_NODE             default: SLURM_GPUS_ON_NODE, then SLURM_GPUS_PER_NODE
  RECIPE                    recipe id for `verl-recipes verify --recipe` (templates set it)
  TRAIN_CMD                 shell command run on the head once Ray is ready (templates set a default)
Rehearsal (CPU, no GPU)
  REHEARSAL=1               probe instead of TRAIN_CMD; GPUS_PER_NODE becomes logical Ray GPUs
  RAY_NODES_PER_HOST        Ray nodes per Slurm node, each its own srun step (rehearsal only; default 1)
  REHEARSAL_HOLD_S          keep Ray up this long after the probe (default 0)
Ray
  RAY_PORT, RAY_DASHBOARD_PORT, RAY_CLIENT_SERVER_PORT    default 6379, 8265, 10001
  RAY_NODE_PORT_BASE        node ports: slot s uses BASE+10s .. BASE+10s+5 (default 6800)
  RAY_MIN_WORKER_PORT, RAY_MAX_WORKER_PORT                default 10002, 19999 (split between slots)
  RAY_PORT_OFFSET           added to every port above (two jobs on one node: offsets >= 20000 apart)
  RAY_DASHBOARD_HOST        default 127.0.0.1;  RAY_DASHBOARD=0 leaves the dashboard out
  RAY_OBJECT_STORE_BYTES    per Ray node (rehearsal default 200000000)
  RAY_READY_TIMEOUT_S       deadline for every node and GPU to register (default 600)
  RAY_STOP_GRACE_S          seconds steps get after SIGTERM before they are killed (default 20)
  RAY_NOFILE                soft open-files limit raised to this, within the hard limit (default 65536)
  RAY_TMPDIR                node-local Ray temp dir (default /tmp/ray-<job id>)
Network
  NCCL_SOCKET_IFNAME        interface(s) for NCCL, NCCL syntax (eth, ^lo,docker0, =ib0); the first
                            match with an IPv4 address is also Ray's node address
  GLOO_SOCKET_IFNAME        default: the interface chosen from NCCL_SOCKET_IFNAME
Files and runtime
  VERL_RECIPES_ROOT         the checkout (default SLURM_SUBMIT_DIR)
  JOB_DIR                   shared folder for the token and step logs (default ROOT/runs/slurm-<job id>)
  CONTAINER_MOUNTS          extra mounts, comma-separated src[:dst[:flags]]
  CONTAINER_PYTHON          python inside the container (default python3)
  VERIFY=0                  skip `verl-recipes verify` (it says so in the log)
  DRY_RUN=1                 print the srun lines and exit 0
"""


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RecipeError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise RecipeError(f"{name} must be >= {minimum}, got {value}")
    return value


def _env_flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise RecipeError(f"{name} must be 1 or 0, got {raw!r}")


# --- Slurm's compressed lists -------------------------------------------------------------------


def _split_top(spec: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in (s.strip() for s in parts) if p]


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist such as ``gpu[01-03,07],login1``.

    Used only where ``scontrol`` is absent (a dry run off the cluster); in a job the launcher asks
    ``scontrol show hostnames``, which knows every form Slurm accepts.
    """
    hosts: list[str] = []
    for item in _split_top(spec):
        m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
        if not m:
            hosts.append(item)
            continue
        prefix, ranges, rest = m.groups()
        tails = expand_hostlist(rest) if rest else [""]
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise RecipeError(f"cannot read the host list {spec!r}; pass plain comma-separated names")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.extend(f"{prefix}{i:0{width}d}{t}" for t in tails)
    return hosts


def expand_counts(spec: str) -> list[int]:
    """Expand SLURM_JOB_CPUS_PER_NODE style counts: ``72(x2),36`` -> [72, 72, 36]."""
    out: list[int] = []
    for item in _split_top(spec):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item)
        if not m:
            raise RecipeError(f"cannot read the per-node counts {spec!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def job_hosts(nodelist: str) -> list[str]:
    """The allocation's hosts in Slurm's order; the first is where the batch step runs."""
    if shutil.which("scontrol"):
        res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if res.returncode == 0 and res.stdout.strip():
            return res.stdout.split()
    return expand_hostlist(nodelist)


def gpus_from_slurm(env: Mapping[str, str]) -> int:
    """GPUs per node as Slurm states them: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE ([type:]N)."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit():
        return int(on_node)
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node:
        tail = per_node.split(",")[0].rsplit(":", 1)[-1]
        if tail.isdigit():
            return int(tail)
    return 0


# --- ports --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    """Every port a job's Ray uses, so a firewall or a second job on the node can be planned for."""

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001
    node_base: int = 6800
    min_worker: int = 10002
    max_worker: int = 19999

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Ports:
        off = _env_int(env, "RAY_PORT_OFFSET", 0)
        d = cls()
        return cls(
            gcs=_env_int(env, "RAY_PORT", d.gcs, 1) + off,
            dashboard=_env_int(env, "RAY_DASHBOARD_PORT", d.dashboard, 1) + off,
            client=_env_int(env, "RAY_CLIENT_SERVER_PORT", d.client, 1) + off,
            node_base=_env_int(env, "RAY_NODE_PORT_BASE", d.node_base, 1) + off,
            min_worker=_env_int(env, "RAY_MIN_WORKER_PORT", d.min_worker, 1) + off,
            max_worker=_env_int(env, "RAY_MAX_WORKER_PORT", d.max_worker, 1) + off,
        )

    def node(self, slot: int) -> dict[str, int]:
        base = self.node_base + 10 * slot
        return {
            "node-manager-port": base,
            "object-manager-port": base + 1,
            "runtime-env-agent-port": base + 2,
            "dashboard-agent-grpc-port": base + 3,
            "dashboard-agent-listen-port": base + 4,
            "metrics-export-port": base + 5,
        }

    def workers(self, slot: int, slots: int) -> tuple[int, int]:
        chunk = (self.max_worker - self.min_worker + 1) // slots
        lo = self.min_worker + slot * chunk
        return lo, lo + chunk - 1

    def check(self, slots: int) -> None:
        fixed = {"RAY_PORT": self.gcs, "RAY_DASHBOARD_PORT": self.dashboard, "RAY_CLIENT_SERVER_PORT": self.client}
        for s in range(slots):
            fixed.update({f"{k} (slot {s})": v for k, v in self.node(s).items()})
        for name, port in fixed.items():
            if not 1024 <= port <= 65535:
                raise RecipeError(f"{name} is {port} after RAY_PORT_OFFSET; ports must be in 1024-65535")
            if self.min_worker <= port <= self.max_worker:
                raise RecipeError(
                    f"{name}={port} falls inside the worker ports {self.min_worker}-{self.max_worker}; "
                    "move RAY_NODE_PORT_BASE/RAY_PORT or RAY_MIN_WORKER_PORT/RAY_MAX_WORKER_PORT"
                )
        seen: dict[int, str] = {}
        for name, port in fixed.items():
            if port in seen:
                raise RecipeError(f"{name} and {seen[port]} are both {port}; give them different ports")
            seen[port] = name
        if self.max_worker > 65535 or self.max_worker - self.min_worker + 1 < 50 * slots:
            raise RecipeError(
                f"worker ports {self.min_worker}-{self.max_worker} give fewer than 50 per Ray node "
                f"({slots} per host) or pass 65535; widen RAY_MIN_WORKER_PORT/RAY_MAX_WORKER_PORT"
            )


# --- the validated launch settings ---------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything the launcher needs, validated; built only by `check()`."""

    runtime: str
    rehearsal: bool
    hosts: tuple[str, ...]
    gpus_per_node: int
    tp: int
    pp: int
    ray_nodes_per_host: int
    job_id: str
    root: Path
    job_dir: Path
    ray_tmpdir: str
    ports: Ports
    recipe: str | None = None
    model_path: str | None = None
    train_cmd: str | None = None
    image: str | None = None
    mounts: tuple[str, ...] = ()
    container_python: str = "python3"
    dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    object_store_bytes: int | None = None
    ready_timeout_s: int = 600
    stop_grace_s: int = 20
    nofile: int = 65536
    hold_s: int = 0
    verify: bool = True
    dry_run: bool = False

    @property
    def ray_nodes(self) -> int:
        return len(self.hosts) * self.ray_nodes_per_host

    @property
    def total_gpus(self) -> int:
        return self.ray_nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.total_gpus // (self.tp * self.pp) if self.total_gpus else 0

    def summary(self) -> str:
        shape = (
            f"{self.ray_nodes} Ray nodes x {self.gpus_per_node} GPUs = {self.total_gpus}"
            f" (TP{self.tp} x PP{self.pp} x DP{self.dp})"
        )
        mode = "rehearsal (CPU, logical GPUs)" if self.rehearsal else "train"
        return (
            f"job {self.job_id} on {','.join(self.hosts)}: {shape}; runtime {self.runtime}; {mode}; "
            f"job dir {self.job_dir}"
        )


def _check_heads(config_json: Path, tp: int) -> None:
    """TP splits attention by heads (`layout.heads_over_tp`), read from the checkpoint's config.json."""
    try:
        cfg = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return  # train's pre-flight reads and refuses it with the reason
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0:
        layout.heads_over_tp(tp, heads, kv, "TP", kv_replicated=False)


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~")) or s.endswith((".sqsh", ".sif", ".squashfs"))


def check(env: Mapping[str, str], runtime: str, dry_run: bool = False) -> Settings:
    """Validate a launch from its environment before anything starts; raise one-line RecipeErrors.

    The templates call this (``ray_cluster check``) and ``launch`` calls it again, so a bad TP/PP
    or a missing image ends the job in seconds with the line that says what to change, instead of
    after minutes of container import and Ray start-up.
    """
    if runtime not in RUNTIMES:
        raise RecipeError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    rehearsal = _env_flag(env, "REHEARSAL")
    dry_run = dry_run or _env_flag(env, "DRY_RUN")

    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        raise RecipeError(
            "no Slurm allocation (SLURM_JOB_NODELIST is unset): submit with sbatch, "
            "or set DRY_RUN=1 SLURM_JOB_NODELIST=node[1-4] to print the plan"
        )
    hosts = tuple(job_hosts(nodelist))
    job_id = env.get("SLURM_JOB_ID", "").strip() or ("dry-run" if dry_run else "")
    if not job_id:
        raise RecipeError("SLURM_JOB_ID is unset: run the launcher from an sbatch script")

    per_host = _env_int(env, "RAY_NODES_PER_HOST", 1, 1)
    if per_host > 1 and not rehearsal:
        raise RecipeError(
            f"RAY_NODES_PER_HOST={per_host} stacks Ray nodes on one host and is for "
            "REHEARSAL=1 only; unset it or set REHEARSAL=1"
        )

    gpus = _env_int(env, "GPUS_PER_NODE", -1, 0)
    if gpus < 0:
        gpus = 0 if rehearsal else gpus_from_slurm(env)
    if gpus == 0 and not rehearsal:
        raise RecipeError(
            "the allocation has no GPUs: submit with --gpus-per-node=N (or set GPUS_PER_NODE), "
            "or set REHEARSAL=1 for a CPU rehearsal"
        )

    tp = _env_int(env, "TP", 1, 1)
    pp = _env_int(env, "PP", 1, 1)
    nodes = len(hosts) * per_host
    if gpus:
        # The rules `train`'s pre-flight and the planner apply too (verl_recipes.layout).
        layout.tp_in_node(gpus, tp)
        layout.data_parallel(nodes, gpus, (tp, pp), "TP x PP", "change TP/PP or the node or GPU count")
    elif tp * pp > 1:
        raise RecipeError(f"TP x PP = {tp * pp} needs GPUs; set GPUS_PER_NODE (logical GPUs in a rehearsal)")

    model = env.get("MODEL_PATH", "").strip() or None
    if not rehearsal:
        if not model:
            raise RecipeError("MODEL_PATH is not set; set it to a Hugging Face checkpoint folder every node sees")
        if _looks_like_path(model):
            mp = Path(model).expanduser()
            if not (mp / "config.json").is_file():
                raise RecipeError(
                    f"MODEL_PATH={model} is not a folder with config.json; point it at an HF "
                    "checkpoint on a filesystem every node sees"
                )
            _check_heads(mp / "config.json", tp)

    train_cmd = env.get("TRAIN_CMD", "").strip() or None
    if not rehearsal and not train_cmd:
        raise RecipeError(
            "TRAIN_CMD is not set; set it to the command the head runs once Ray is up (the templates set one)"
        )

    image = env.get("CONTAINER_IMAGE", "").strip() or None
    if runtime != "bare":
        kind = ".sqsh file or a registry image" if runtime == "pyxis" else ".sif file or a docker:// URI"
        if not image:
            raise RecipeError(f"CONTAINER_IMAGE is not set; set it to a {kind} for {runtime}")
        if _looks_like_path(image) and "://" not in image and not Path(image).expanduser().is_file():
            raise RecipeError(f"CONTAINER_IMAGE={image} does not exist; set it to a {kind} every node sees")

    ports = Ports.from_env(env)
    ports.check(per_host)

    root = Path(env.get("VERL_RECIPES_ROOT") or env.get("SLURM_SUBMIT_DIR") or os.getcwd()).resolve()
    job_dir = Path(env.get("JOB_DIR") or root / "runs" / f"slurm-{job_id}").resolve()
    mounts = tuple(m for m in (s.strip() for s in env.get("CONTAINER_MOUNTS", "").split(",")) if m)

    obj = _env_int(env, "RAY_OBJECT_STORE_BYTES", 0, 0) or (200_000_000 if rehearsal else None)
    return Settings(
        runtime=runtime,
        rehearsal=rehearsal,
        hosts=hosts,
        gpus_per_node=gpus,
        tp=tp,
        pp=pp,
        ray_nodes_per_host=per_host,
        job_id=job_id,
        root=root,
        job_dir=job_dir,
        ray_tmpdir=env.get("RAY_TMPDIR") or f"/tmp/ray-{job_id}",
        ports=ports,
        recipe=env.get("RECIPE") or None,
        model_path=model,
        train_cmd=train_cmd,
        image=image,
        mounts=mounts,
        container_python=env.get("CONTAINER_PYTHON") or "python3",
        dashboard=_env_flag(env, "RAY_DASHBOARD", True),
        dashboard_host=env.get("RAY_DASHBOARD_HOST") or "127.0.0.1",
        object_store_bytes=obj,
        ready_timeout_s=_env_int(env, "RAY_READY_TIMEOUT_S", 600, 1),
        stop_grace_s=_env_int(env, "RAY_STOP_GRACE_S", 20, 1),
        nofile=_env_int(env, "RAY_NOFILE", 65536, 1024),
        hold_s=_env_int(env, "REHEARSAL_HOLD_S", 0, 0),
        verify=_env_flag(env, "VERIFY", True),
        dry_run=dry_run,
    )


# --- the srun lines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One Slurm job step: its name (for logs and scancel), where it runs, and the srun argv."""

    name: str
    argv: list[str]
    log: Path | None = None


class Planner:
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
        if self.s.model_path and _looks_like_path(self.s.model_path):
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
        if self.s.recipe and not self.s.rehearsal:
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
        if self.s.rehearsal:
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
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": base.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "5"),
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


# --- the launcher (batch step) -------------------------------------------------------------------


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


def _say(msg: str) -> None:
    print(f"ray-slurm [+{time.monotonic() - _T0:.0f}s]: {msg}", flush=True)


class Launcher:
    """Runs the plan: verify, head, workers, driver; tears everything down on any exit."""

    def __init__(self, s: Settings, planner: Planner, env: dict[str, str], token_path: Path) -> None:
        self.s, self.p, self.env, self.token_path = s, planner, env, token_path
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
            _say("VERIFY=0: skipping `verl-recipes verify` on the nodes")
            return
        step = self.p.verify()
        _say(f"verify on {len(self.s.hosts)} node(s): {shlex.join(step.argv)}")
        rc = subprocess.run(step.argv, env=self.env, stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            raise RecipeError(
                f"`verl-recipes verify` failed (exit {rc}) on at least one node; "
                "fix what it printed above, or set VERIFY=0 to skip it knowingly"
            )

    def wait_started(self, started: Sequence[tuple[Step, subprocess.Popen[bytes]]]) -> None:
        """Wait until each node step's log says its Ray node is up.

        `ray start` prints STARTED once its raylet has registered with the GCS, and it gives the
        raylet a fixed 30 s for that; starting the next node on a busy host (rehearsal stacks
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
        _say(f"starting the Ray head on {slots[0][0]} (log {head.log})")
        self.wait_started([(head, self.start(head))])
        info = json.loads(head_file.read_text())
        address = f"{info['ip']}:{info['port']}"
        _say(f"Ray head is up at {address}; starting {len(slots) - 1} worker node(s)")
        # One wave per slot: different hosts start together, stacked slots of a host one by one.
        for slot in range(self.s.ray_nodes_per_host):
            wave = [self.p.node(h, sl, head_address=address) for h, sl in slots[1:] if sl == slot]
            if wave:
                self.wait_started([(st, self.start(st)) for st in wave])
                _say(
                    f"{len(wave)} worker node(s) up ({', '.join(h for h, sl in slots[1:] if sl == slot)}, slot {slot})"
                )
        self.env["RAY_ADDRESS"] = address
        driver = self.start(self.p.driver(address))
        while True:
            rc = driver.poll()
            if rc is not None:
                _say(f"driver step exited {rc}")
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
            _say(f"stopping {len(live)} step(s) ({', '.join(sorted(names))}) with SIGTERM")
            if ids:
                subprocess.run(["scancel", "--signal=TERM", *ids], capture_output=True, check=False)
            else:  # squeue unavailable (job ending): srun forwards and then kills the step itself
                for _, p in live:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
            left = self._wait([p for _, p in live], self.s.stop_grace_s)
            if left:
                ids = self._step_ids(names)
                _say(
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
                _say("the reap step did not finish in 60s; Slurm kills what is left when the job ends")
        _say("teardown done")


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
    planner = Planner(s, python)
    token_path = s.job_dir / "auth_token"
    _say(s.summary())
    if env.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
        _say(f"requeued run {env['SLURM_RESTART_COUNT']}: TRAIN_CMD resumes through trainer.resume_mode=auto")
    if s.dry_run:
        senv = step_env(s, {}, token_path)
        print("env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(senv.items())))
        slots = planner.node_slots()
        head_address = f"HEAD_IP:{s.ports.gcs}"
        steps = [planner.verify(), planner.node(*slots[0], head_address=None)]
        steps += [planner.node(h, sl, head_address=head_address) for h, sl in slots[1:]]
        steps += [planner.driver(head_address), planner.reap()]
        for st in steps:
            if st.name != "verify" or s.verify:
                print(shlex.join(st.argv))
        return 0

    token_path = _new_token(s.job_dir)
    launcher = Launcher(s, planner, step_env(s, env, token_path), token_path)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Stop(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    requeue = False
    try:
        rc = launcher.run()
    except _Stop as e:
        _say(f"received {e}: stopping Ray on every node")
        rc = 128 + e.signum
        # The templates ask for SIGUSR1 two minutes before the time limit (--signal=B:USR1@120).
        requeue = e.signum == signal.SIGUSR1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # a second scancel must not cut the teardown short
        launcher.teardown()
    if requeue:
        _say(f"time limit near: requeueing job {s.job_id}; the next run resumes through trainer.resume_mode=auto")
        res = subprocess.run(["scontrol", "requeue", s.job_id], capture_output=True, text=True, check=False)
        if res.returncode:
            _say(f"scontrol requeue failed: {res.stderr.strip()} (submit with --requeue to allow it)")
    return rc


# --- in-step commands ----------------------------------------------------------------------------


def match_ifnames(spec: str, names: Sequence[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects, in `names` order: prefixes, ``^`` excludes, ``=`` exact."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    pats = [p for p in spec.lstrip("=").split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in pats)

    return [n for n in names if hit(n) != exclude]


def iface_ipv4(name: str) -> str | None:
    """The IPv4 address of an interface (SIOCGIFADDR), or None."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def node_ip(env: Mapping[str, str]) -> tuple[str, str | None]:
    """This node's address for Ray, and the interface it came from.

    NCCL_SOCKET_IFNAME names the fabric the job is meant to use, so its first interface with an
    IPv4 address wins. Without it: the hostname's address, unless that is loopback (common in
    /etc/hosts), then the address of the interface that routes outwards.
    """
    spec = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if spec:
        names = [n for _, n in socket.if_nameindex()]
        for name in match_ifnames(spec, names):
            ip = iface_ipv4(name)
            if ip:
                return ip, name
        raise RecipeError(
            f"NCCL_SOCKET_IFNAME={spec} matches no interface with an IPv4 address on "
            f"{socket.gethostname()} (interfaces: {', '.join(names)})"
        )
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    if ipaddress.ip_address(ip).is_loopback:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect(("10.254.254.254", 1))  # UDP connect sends nothing; it picks the route
                ip = s.getsockname()[0]
            except OSError:
                pass
    return ip, None


def raise_nofile(target: int) -> int:
    """Raise the soft open-files limit towards target (within the hard limit); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    if soft < target:
        print(
            f"ray-slurm: warning: open-files limit is {soft} (hard limit), below RAY_NOFILE={target}",
            file=sys.stderr,
            flush=True,
        )
    return soft


def cmd_node(args: argparse.Namespace) -> int:
    """Inside a step: pick the address, raise limits, record the session, exec `ray start --block`."""
    env = os.environ
    ip, iface = node_ip(env)
    os.environ[MARKER] = args.job  # inherited by every Ray process of this node; `reap` matches on it
    if iface and not env.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = iface  # Gloo takes one exact name, not NCCL's prefixes
    raise_nofile(args.nofile)
    cpus = max(1, int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1) // args.slots)
    tmp = Path(args.temp_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    # `reap` finds leftovers by this session id (Slurm starts each step in its own session).
    (tmp / f"node-{args.slot}.sid").write_text(f"{os.getsid(0)}\n")
    ray_args = list(args.ray_args)
    if ray_args[:1] == ["--"]:
        ray_args = ray_args[1:]
    if args.write_head:
        port = next(int(a.split("=", 1)[1]) for a in ray_args if a.startswith("--port="))
        head = Path(args.job_dir) / "head.json"
        info = {"ip": ip, "port": port, "host": socket.gethostname()}
        head.with_suffix(".tmp").write_text(json.dumps(info))
        head.with_suffix(".tmp").replace(head)
    ray = Path(sys.executable).with_name("ray")
    exe = str(ray) if ray.is_file() else "ray"
    argv = [
        exe,
        "start",
        "--block",
        f"--node-ip-address={ip}",
        f"--num-cpus={cpus}",
        f"--num-gpus={args.gpus}",
        *ray_args,
    ]
    print(f"ray-slurm: {socket.gethostname()} slot {args.slot}: {shlex.join(argv)}", flush=True)
    os.execvp(exe, argv)
    return 0  # not reached


def wait_ready(address: str, nodes: int, gpus: int, timeout_s: float) -> list[dict[str, Any]]:
    """Connect to Ray and poll until `nodes` alive nodes with `gpus` GPUs in total have registered."""
    import ray

    t0 = time.monotonic()
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        have = sum(int(n["Resources"].get("GPU", 0)) for n in alive)
        if len(alive) >= nodes and have >= gpus:
            cpus = sum(int(n["Resources"].get("CPU", 0)) for n in alive)
            print(
                f"ray-slurm: Ray ready after {time.monotonic() - t0:.1f}s: {len(alive)}/{nodes} nodes, "
                f"{have}/{gpus} GPUs, {cpus} CPUs",
                flush=True,
            )
            return alive
        if time.monotonic() - t0 > timeout_s:
            raise RecipeError(
                f"Ray not ready after RAY_READY_TIMEOUT_S={timeout_s:.0f}s: {len(alive)}/"
                f"{nodes} nodes and {have}/{gpus} GPUs registered; see the job dir's ray-*.log"
            )
        time.sleep(1)


def probe(alive: Sequence[Mapping[str, Any]], timeout_s: float = 120) -> list[dict[str, Any]]:
    """Run one task pinned to each Ray node; check each ran where it was sent."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    def where() -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    refs = [
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)).remote()
        for n in alive
    ]
    got = ray.get(refs, timeout=timeout_s)
    for n, r in zip(alive, got):  # noqa: B905 - same length by construction; zip(strict) needs 3.10
        if r["node_id"] != n["NodeID"]:
            raise RecipeError(f"probe for node {n['NodeID'][:12]} ran on {r['node_id'][:12]}; node affinity failed")
        gpus = int(n["Resources"].get("GPU", 0))
        print(
            f"ray-slurm: probe node {r['node_id'][:12]} host {r['host']} ip {r['ip']} pid {r['pid']} GPUs {gpus}",
            flush=True,
        )
    return got


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def cmd_driver(args: argparse.Namespace) -> int:
    raise_nofile(args.nofile)
    alive = wait_ready(args.address, args.nodes, args.gpus, args.timeout)
    # Ray's core installs a crash handler that dumps a stack on SIGTERM; a stop is not a crash.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.probe:
        got = probe(alive)
        hosts = sorted({r["host"] for r in got})
        print(
            f"ray-slurm: probe ok: {len(got)}/{args.nodes} Ray nodes answered on {len(hosts)} host(s) "
            f"({', '.join(hosts)}); {args.gpus} GPUs",
            flush=True,
        )
        if args.hold:
            print(f"ray-slurm: holding Ray up for {args.hold}s (REHEARSAL_HOLD_S)", flush=True)
            time.sleep(args.hold)
        return 0
    import ray

    ray.shutdown()
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise RecipeError("driver: no command after --")
    print(f"ray-slurm: running on the head: {shlex.join(cmd)}", flush=True)
    os.execvp(cmd[0], cmd)
    return 0  # not reached


def _proc_entries() -> list[tuple[int, int, str, bytes]]:
    """(pid, session id, cmdline, environ) of every process this user can read."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            sid = int(stat.rsplit(")", 1)[1].split()[3])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            environ = (d / "environ").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        out.append((int(d.name), sid, cmd, environ))
    return out


def leftovers(job: str, sids: set[int]) -> list[int]:
    """Pids of this job's Ray processes on this host.

    Two ways to be one: the job marker in the environment (`node` sets it just before exec'ing
    `ray start`, so every Ray process inherits it, and nothing else of the job has it), or
    membership of a session a Ray node step ran in (Slurm gives each step its own session; this
    catches processes that rewrote their title and environment block, such as
    ``ray::DashboardAgent``). slurmstepd, this process and its parent are never chosen.
    """
    me = {os.getpid(), os.getppid()}
    marker = f"{MARKER}={job}".encode()
    pids = []
    for pid, sid, cmd, environ in _proc_entries():
        if pid in me or cmd.startswith("slurmstepd"):
            continue
        if sid in sids or marker in environ.split(b"\0"):
            pids.append(pid)
    return pids


def cmd_reap(args: argparse.Namespace) -> int:
    """Inside a step on every node: stop what is left of this job's Ray, then remove its temp dir."""
    tmp = Path(args.temp_dir)
    sids = set()
    for f in tmp.glob("node-*.sid"):
        with contextlib.suppress(ValueError, OSError):
            sids.add(int(f.read_text().strip()))
    pids = leftovers(args.job, sids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        pids = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not pids:
            break
    shutil.rmtree(tmp, ignore_errors=True)
    left = f"{len(pids)} would not die" if pids else "nothing left"
    ending = wait_stepds(args.job, os.environ.get("SLURM_STEP_ID"), args.wait)
    if ending:
        left += f"; step(s) {', '.join(ending)} still ending after {args.wait:.0f}s"
    print(f"ray-slurm: reap on {socket.gethostname()}: {left}", flush=True)
    return 0 if not pids else 1


def stepds(job: str, own: str | None) -> list[str]:
    """This job's steps whose slurmstepd still runs on this host (`slurmstepd: [JOB.STEP]`), the
    batch and extern steps and this step aside."""
    title = re.compile(rf"^slurmstepd: \[{re.escape(job)}\.(\d+)\]")
    steps = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            m = title.match((d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
        except OSError:
            continue
        if m and m.group(1) != own:
            steps.append(f"{job}.{m.group(1)}")
    return sorted(set(steps))


def wait_stepds(job: str, own: str | None, seconds: float) -> list[str]:
    """Wait until no other step of this job has a slurmstepd on this host; returns those left.

    Slurm drops a step once its tasks exit, but its slurmstepd ends only after every process of
    the step has (for a Ray node, seconds after `ray start` returns). A job requeued before then
    runs again beside the old slurmstepds, under the same step ids (a requeued run numbers its
    steps from 0 again), and the old ones, ending, take the new steps' place: the rerun fails. So
    the teardown's reap, on every node, returns only once they are gone, and the launcher
    requeues after it.
    """
    deadline = time.monotonic() + seconds
    while True:
        left = stepds(job, own)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# --- command line --------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    _say("check ok: " + check(os.environ, args.runtime).summary())
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    return launch(check(os.environ, args.runtime, args.dry_run), os.environ)


def _runtime_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=RUNTIMES, default="bare", help="how steps run (default bare)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate the allocation and variables; one line and exit 2 if wrong")
    _runtime_arg(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("launch", help="run the whole job: verify, Ray head and workers, driver, teardown")
    _runtime_arg(p)
    p.add_argument("--dry-run", action="store_true", help="print the srun lines and exit (also DRY_RUN=1)")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("env", help="list the variables the launcher reads")
    p.set_defaults(func=lambda _a: print(ENV_HELP, end="") or 0)

    p = sub.add_parser("node", help="(in a step) start one Ray node: ray start --block")
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--nofile", type=int, default=65536)
    p.add_argument("--job-dir", required=True)
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--job", required=True, help="the Slurm job id, marked on every Ray process")
    p.add_argument("--write-head", action="store_true", help="publish this node's address in head.json")
    p.add_argument("ray_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("driver", help="(in a step) wait for every node and GPU, then probe or run a command")
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--nofile", type=int, default=65536)
    p.add_argument("--probe", action="store_true", help="rehearsal: a task pinned to each node, no command")
    p.add_argument("--hold", type=int, default=0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_driver)

    p = sub.add_parser("reap", help="(in a step) kill what is left of this job's Ray on this node")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--wait", type=float, default=40.0, help="seconds to wait for the job's other steps to end")
    p.set_defaults(func=cmd_reap)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ray-slurm",
        help="bootstrap Ray on a Slurm allocation and run a recipe",
        description=(__doc__ or "").splitlines()[0],
    )
    add_commands(p.add_subparsers(dest="ray_command", metavar="COMMAND", required=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=(__doc__ or "").splitlines()[0])
    add_commands(parser.add_subparsers(dest="ray_command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
