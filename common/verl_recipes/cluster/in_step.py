"""What runs inside the job steps: start one Ray node, drive the run on the head, reap a node.

`node` picks the node's address (NCCL_SOCKET_IFNAME's interface when set), raises the open-files
limit, marks every Ray process with the job (procs.RAY_JOB_ENV) and execs `ray start --block`;
`driver` waits until every node and GPU has registered and runs TRAIN_CMD (or, in a probe run, a
probe pinned to each node); `reap` ends what is left of this job's Ray on a node and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, procs


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
    os.environ[procs.RAY_JOB_ENV] = args.job  # inherited by every Ray process of this node; `reap` matches on it
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
            print(f"ray-slurm: holding Ray up for {args.hold}s (PROBE_HOLD_S)", flush=True)
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


def leftovers(job: str, sids: set[int]) -> list[int]:
    """Pids of this job's Ray processes on this host.

    Two ways to be one: the job marker in the environment (`node` sets it just before exec'ing
    `ray start`, so every Ray process inherits it, and nothing else of the job has it), or
    membership of a session a Ray node step ran in (Slurm gives each step its own session; this
    catches processes that rewrote their title and environment block, such as
    ``ray::DashboardAgent``). slurmstepd, this process and its parent are never chosen.
    """
    me = {os.getpid(), os.getppid()}
    marker = procs.job_marker(job)
    return [
        pid
        for pid in sorted(procs.all_pids() - me)
        if not procs.command_line(pid).startswith("slurmstepd")
        and (procs.session_id(pid) in sids or procs.has_marker(pid, marker))
    ]


def cmd_reap(args: argparse.Namespace) -> int:
    """Inside a step on every node: stop what is left of this job's Ray, then remove its temp dir."""
    tmp = Path(args.temp_dir)
    sids = set()
    for f in tmp.glob("node-*.sid"):
        with contextlib.suppress(ValueError, OSError):
            sids.add(int(f.read_text().strip()))
    _, left = procs.end(lambda: leftovers(args.job, sids), grace_s=5, kill_wait_s=5)
    shutil.rmtree(tmp, ignore_errors=True)
    said = f"{len(left)} would not die" if left else "nothing left"
    ending = wait_stepds(args.job, os.environ.get("SLURM_STEP_ID"), args.wait)
    if ending:
        said += f"; step(s) {', '.join(ending)} still ending after {args.wait:.0f}s"
    print(f"ray-slurm: reap on {socket.gethostname()}: {said}", flush=True)
    return 0 if not left else 1


def stepds(job: str, own: str | None) -> list[str]:
    """This job's steps whose slurmstepd still runs on this host (`slurmstepd: [JOB.STEP]`), the
    batch and extern steps and this step aside."""
    title = re.compile(rf"^slurmstepd: \[{re.escape(job)}\.(\d+)\]")
    steps = set()
    for pid in procs.all_pids():
        m = title.match(procs.command_line(pid))
        if m and m.group(1) != own:
            steps.add(f"{job}.{m.group(1)}")
    return sorted(steps)


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
