"""A launch's settings: the allocation and the variables, checked before anything starts.

`check()` reads Slurm's environment and the variables in ENV_HELP and returns Settings, or raises
one RecipeError line that says what to change (no MODEL_PATH, GPUs not divisible by TP x PP, no
container image, ports that collide), so a bad launch ends in seconds, not after minutes of
container import and Ray start-up.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError, layout

RUNTIMES = ("bare", "pyxis", "apptainer")


ENV_HELP = """\
Required
  MODEL_PATH                HF checkpoint folder every node sees (not needed with PROBE=1)
  CONTAINER_IMAGE           pyxis: .sqsh file or registry image; apptainer: .sif file or docker:// URI
Shape
  TP, PP                    tensor / pipeline parallel sizes (default 1); GPUs must divide by TP x PP
  GPUS_PER_NODE             default: SLURM_GPUS_ON_NODE, then SLURM_GPUS_PER_NODE
  RECIPE                    recipe id for `verl-recipes verify --recipe` (templates set it)
  TRAIN_CMD                 shell command run on the head once Ray is ready (templates set a default)
Probe run (CPU, no GPU; REHEARSAL=1 and REHEARSAL_HOLD_S are the old names)
  PROBE=1                   probe instead of TRAIN_CMD; GPUS_PER_NODE becomes logical Ray GPUs
  RAY_NODES_PER_HOST        Ray nodes per Slurm node, each its own srun step (probe run only; default 1)
  PROBE_HOLD_S              keep Ray up this long after the probe (default 0)
Ray
  RAY_PORT, RAY_DASHBOARD_PORT, RAY_CLIENT_SERVER_PORT    default 6379, 8265, 10001
  RAY_NODE_PORT_BASE        node ports: slot s uses BASE+10s .. BASE+10s+5 (default 6800)
  RAY_MIN_WORKER_PORT, RAY_MAX_WORKER_PORT                default 10002, 19999 (split between slots)
  RAY_PORT_OFFSET           added to every port above (two jobs on one node: offsets >= 20000 apart)
  RAY_DASHBOARD_HOST        default 127.0.0.1;  RAY_DASHBOARD=0 leaves the dashboard out
  RAY_OBJECT_STORE_BYTES    per Ray node (probe run default 200000000)
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


@dataclass(frozen=True)
class Ports:
    """Every port a job's Ray uses, so a firewall rule or a second job on the node can allow for them."""

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


@dataclass(frozen=True)
class Settings:
    """Everything the launcher needs, checked; built only by `check()`."""

    runtime: str
    probe: bool
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
    plan: str | None = None  # the planner's verdict on the job and the allocation's GPU (`fits`)

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
        mode = "probe run (CPU, logical GPUs)" if self.probe else "train"
        return (
            f"job {self.job_id} on {','.join(self.hosts)}: {shape}; runtime {self.runtime}; {mode}; "
            f"job dir {self.job_dir}" + (f"; {self.plan}" if self.plan else "")
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


#: train's layout facts per recipe and variant, generated by `verl-recipes docs --write` (JSON: read here
#: on a node's bare python3, where neither verl nor PyYAML is)
INDEX = Path("recipes") / "index.json"
_BATCH_SETS = {
    "data.train_batch_size": "train_batch_size",
    "actor_rollout_ref.rollout.n": "rollout_n",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "ppo_mini_batch_size",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout_tp",
}


def _train_args(train_cmd: str) -> tuple[list[str], dict[str, str]]:
    """The --variant names and --set KEY=VALUE pairs of a `verl-recipes train` command line."""

    try:
        words = shlex.split(train_cmd)
    except ValueError:
        return [], {}
    variants: list[str] = []
    sets: dict[str, str] = {}
    for i, w in enumerate(words):
        val = words[i + 1] if i + 1 < len(words) else ""
        if w.startswith(("--variant=", "--set=")):
            w, val = w.split("=", 1)
        if w == "--variant" and val:
            variants.append(val)
        elif w == "--set" and "=" in val:
            k, v = val.split("=", 1)
            sets[k.lstrip("+~")] = v
    return variants, sets


def check_train_layout(root: Path, recipe: str, train_cmd: str, nodes: int, gpus: int, tp: int, pp: int) -> None:
    """`train`'s layout rules for RECIPE's job on this allocation (verl_recipes.layout, the
    same functions `plan` and `train`'s pre-flight call): Megatron TP and PP as the recipe runs
    them, the rollout's TP inside a node, and the batch over data-parallel ranks. A recipe or
    variant the index does not hold is left to `train` on the head."""
    try:
        index = json.loads((root / INDEX).read_text())["recipes"]
    except (OSError, ValueError, KeyError):
        return
    if recipe not in index:
        return
    variants, sets = _train_args(train_cmd)
    facts = dict(index[recipe].get("layouts", {}).get("+".join(variants) or "default") or {})
    if not facts:
        return
    for key, name in _BATCH_SETS.items():
        if sets.get(key, "").isdigit():
            facts[name] = int(sets[key])
    if facts["backend"] == "megatron" and (facts["tp"], facts["pp"]) != (tp, pp):
        raise RecipeError(
            f"TP={tp} PP={pp}, but {' --variant '.join([recipe, *variants])} trains with Megatron TP{facts['tp']} x "
            f"PP{facts['pp']} (`train` takes its layout from the recipe): set TP={facts['tp']} PP={facts['pp']}"
        )
    world = nodes * gpus
    rtp = int(facts["rollout_tp"])
    name = "the rollout's TP (actor_rollout_ref.rollout.tensor_model_parallel_size)"
    layout.tp_in_node(gpus, rtp, name)
    layout.data_parallel(nodes, gpus, (rtp,), name, "change it or the node or GPU count")
    if facts["dynamic_bsz"]:
        return
    if facts["backend"] == "megatron":
        dp = layout.data_parallel(
            nodes, gpus, (tp, pp, int(facts["cp"])), "TP x PP x CP", "change TP/PP or the node or GPU count"
        )
        minimal = dp * int(facts["micro_train"])
    else:
        minimal = world
    rows = int(facts["train_batch_size"]) * int(facts["rollout_n"])
    layout.batch_over_ranks(rows, minimal, int(facts["train_batch_size"]), int(facts["ppo_mini_batch_size"]))


def _plan(recipe: str, train_cmd: str, nodes: int, gpus: int, gpu: str | None) -> str | None:
    """The planner's verdict (`cluster.fits`) on TRAIN_CMD's job; a job it refuses raises one line.
    Where the planner cannot run here (a host Python without verl, outside the container the job
    trains in), `train`'s pre-flight on the head judges the same job."""
    try:
        from verl_recipes.cluster.fits import check_fits
    except ImportError as e:
        return f"plan: not judged here ({e.name or e} is not installed); `train` judges it on the head"
    variants, sets = _train_args(train_cmd)
    try:
        return check_fits(recipe, variants, [f"{k}={v}" for k, v in sets.items()], nodes, gpus, gpu)
    except ImportError as e:
        return f"plan: not judged here ({e.name or e} is not installed); `train` judges it on the head"


def looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~")) or s.endswith((".sqsh", ".sif", ".squashfs"))


def check(env: Mapping[str, str], runtime: str, dry_run: bool = False, gpu: str | None = None) -> Settings:
    """Validate a launch from its environment before anything starts; raise one-line RecipeErrors.

    The templates call this (``python -m verl_recipes.cluster check``) and ``launch`` calls it again, so a bad TP/PP
    or a missing image ends the job in seconds with the line that says what to change, instead of
    after minutes of container import and Ray start-up.
    """
    if runtime not in RUNTIMES:
        raise RecipeError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    probe = _env_flag(env, "PROBE") or _env_flag(env, "REHEARSAL")  # REHEARSAL: its old name
    dry_run = dry_run or _env_flag(env, "DRY_RUN")

    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        raise RecipeError(
            "no Slurm allocation (SLURM_JOB_NODELIST is unset): submit with sbatch, "
            "or set DRY_RUN=1 SLURM_JOB_NODELIST=node[1-4] to print the srun lines"
        )
    hosts = tuple(job_hosts(nodelist))
    job_id = env.get("SLURM_JOB_ID", "").strip() or ("dry-run" if dry_run else "")
    if not job_id:
        raise RecipeError("SLURM_JOB_ID is unset: run the launcher from an sbatch script")

    per_host = _env_int(env, "RAY_NODES_PER_HOST", 1, 1)
    if per_host > 1 and not probe:
        raise RecipeError(
            f"RAY_NODES_PER_HOST={per_host} stacks Ray nodes on one host and is for "
            "PROBE=1 only; unset it or set PROBE=1"
        )

    gpus = _env_int(env, "GPUS_PER_NODE", -1, 0)
    if gpus < 0:
        gpus = 0 if probe else gpus_from_slurm(env)
    if gpus == 0 and not probe:
        raise RecipeError(
            "the allocation has no GPUs: submit with --gpus-per-node=N (or set GPUS_PER_NODE), "
            "or set PROBE=1 for a probe run on CPUs"
        )

    tp = _env_int(env, "TP", 1, 1)
    pp = _env_int(env, "PP", 1, 1)
    nodes = len(hosts) * per_host
    if gpus:
        # The rules `train`'s pre-flight and the planner apply too (verl_recipes.layout).
        layout.tp_in_node(gpus, tp)
        layout.data_parallel(nodes, gpus, (tp, pp), "TP x PP", "change TP/PP or the node or GPU count")
    elif tp * pp > 1:
        raise RecipeError(f"TP x PP = {tp * pp} needs GPUs; set GPUS_PER_NODE (logical GPUs in a probe run)")

    model = env.get("MODEL_PATH", "").strip() or None
    if not probe:
        if not model:
            raise RecipeError("MODEL_PATH is not set; set it to a Hugging Face checkpoint folder every node sees")
        if looks_like_path(model):
            mp = Path(model).expanduser()
            if not (mp / "config.json").is_file():
                raise RecipeError(
                    f"MODEL_PATH={model} is not a folder with config.json; point it at an HF "
                    "checkpoint on a filesystem every node sees"
                )
            _check_heads(mp / "config.json", tp)

    train_cmd = env.get("TRAIN_CMD", "").strip() or None
    if not probe and not train_cmd:
        raise RecipeError(
            "TRAIN_CMD is not set; set it to the command the head runs once Ray is up (the templates set one)"
        )

    image = env.get("CONTAINER_IMAGE", "").strip() or None
    if runtime != "bare":
        kind = ".sqsh file or a registry image" if runtime == "pyxis" else ".sif file or a docker:// URI"
        if not image:
            raise RecipeError(f"CONTAINER_IMAGE is not set; set it to a {kind} for {runtime}")
        if looks_like_path(image) and "://" not in image and not Path(image).expanduser().is_file():
            raise RecipeError(f"CONTAINER_IMAGE={image} does not exist; set it to a {kind} every node sees")

    ports = Ports.from_env(env)
    ports.check(per_host)

    root = Path(env.get("VERL_RECIPES_ROOT") or env.get("SLURM_SUBMIT_DIR") or os.getcwd()).resolve()
    plan = None
    if gpus and not probe and env.get("RECIPE") and train_cmd:
        check_train_layout(root, env["RECIPE"], train_cmd, nodes, gpus, tp, pp)
        plan = _plan(env["RECIPE"], train_cmd, nodes, gpus, gpu or env.get("GPU", "").strip() or None)
    job_dir = Path(env.get("JOB_DIR") or root / "runs" / f"slurm-{job_id}").resolve()
    mounts = tuple(m for m in (s.strip() for s in env.get("CONTAINER_MOUNTS", "").split(",")) if m)

    obj = _env_int(env, "RAY_OBJECT_STORE_BYTES", 0, 0) or (200_000_000 if probe else None)
    return Settings(
        runtime=runtime,
        probe=probe,
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
        hold_s=_env_int(env, "PROBE_HOLD_S", 0, 0) or _env_int(env, "REHEARSAL_HOLD_S", 0, 0),
        verify=_env_flag(env, "VERIFY", True),
        dry_run=dry_run,
        plan=plan,
    )
