"""`verl-recipes verify`: is this machine (or container) ready to run the recipes?

Every check ends pass, warn or fail, with a one-line fix for the last two; any fail makes the exit
code 1, so a Dockerfile or CI step can gate on it. `--json` prints the same for machines.

Why these checks: the failures they catch are the ones that cost a GPU hour to discover at step 1
— a CUDA 13 wheel on an older driver, a CPU-only torch in a GPU image, Docker's 64 MB /dev/shm
(Ray's object store and NCCL's shared-memory transport need far more), a low `ulimit -n` (Ray
opens a socket per worker), a package drifted from the pins, a GPU recipe on a host without a
GPU, NCCL that cannot all-reduce between the host's GPUs.

It reports the host, not a job: host RAM is a fact here, and whether a run fits this host's GPUs
and RAM is judged once, by `train`'s pre-flight on the job as it will run (`verl_recipes.preflight`,
the planner). With `--recipe` it adds what the recipe needs installed (vLLM, PEFT, DeepSpeed,
the Megatron stack) and whether it needs a GPU at all.

It has to run where the project is half-installed, so: torch, NVML and the recipes are optional.
Without the recipes checkout (inside an image, VERL_RECIPES_ROOT unset) the recipe checks are
skipped with a warn and the pins come from this package's own metadata (its `gpu` extra pins
torch, vLLM, Ray and verl exactly) plus _MIN_CUDA13_DRIVER, which tests/test_verify.py keeps equal
to images/versions.toml. A missing GPU fails only for a recipe that needs one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import psutil

from verl_recipes import GIB, RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.recipe.metadata import get_recipe

Status = Literal["pass", "warn", "fail"]
_MIN_CUDA13_DRIVER = "580.65.06"  # = images/versions.toml [driver] min_cuda13 (test_verify checks it)
_SHM_MIN = 1 * GIB  # below this Ray's object store and NCCL's SHM transport fail, not just slow down
_NOFILE_MIN = 65536  # Ray's recommendation; it warns below and fails at scale
_TORCH_INDEX = "https://download.pytorch.org/whl/cu130"


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def _v(s: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); '2.11.0+cu130' -> (2, 11, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", s.split("+")[0])[:4])


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class _Pins:
    gpu: dict[str, str]
    cpu_torch: str | None
    python: tuple[str, str, str] | None  # (min, max_exclusive, the GPU image's)
    min_cuda13: str
    source: str
    megatron: dict[str, str] = field(default_factory=dict)  # versions.toml [megatron]: recipe backend megatron


def _load_pins() -> tuple[_Pins, str | None]:
    """Pins from images/versions.toml, else from this package's metadata; plus why it fell back."""
    try:
        from verl_recipes.stack.pins import load_pins

        full = load_pins()
        return (
            _Pins(
                gpu={k: str(v) for k, v in full["gpu"].items()},
                cpu_torch=str(full.get("cpu", {}).get("torch")) if full.get("cpu", {}).get("torch") else None,
                python=(
                    str(full["python"]["min"]),
                    str(full["python"]["max_exclusive"]),
                    str(full["python"]["gpu"]),
                ),
                min_cuda13=str(full["driver"]["min_cuda13"]),
                source="images/versions.toml",
                megatron={
                    k: str(v["version"] if isinstance(v, dict) else v) for k, v in full.get("megatron", {}).items()
                },
            ),
            None,
        )
    except (RecipeError, OSError, KeyError) as e:
        why = str(e)
    gpu: dict[str, str] = {}
    try:
        reqs = metadata.requires("verl-recipes") or []
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        reqs = []
    for req in reqs:
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^;\s]+)", req)
        if m:
            gpu[m.group(1).lower()] = m.group(3)
    return _Pins(gpu, None, None, _MIN_CUDA13_DRIVER, "verl-recipes package metadata"), why


def _recipe(recipe: str | Any | None) -> tuple[Any, Check | None]:
    """The recipe by id (read from the checkout), or as given (`train` has read it already)."""
    if recipe is None:
        return None, None
    if isinstance(recipe, str):
        try:
            repo_root()
        except RecipeError as e:
            return None, Check(
                "recipe",
                "warn",
                f"recipe {recipe}: checks skipped: {e}",
                "set VERL_RECIPES_ROOT=/path/to/verl-recipes checkout (or mount it) to check the recipe's needs",
            )

        recipe = get_recipe(recipe)  # an unknown id is a RecipeError: exit 2 with the valid ids
    r = recipe
    return r, Check("recipe", "pass", f"{r.id}: {r.gpus.count} GPU(s) x {r.gpus.per_gpu_gib} GiB, {r.backend}")


def check_python(pins: _Pins) -> Check:
    v = sys.version.split()[0]
    if pins.python:
        lo, hi, gpu = pins.python
        if not _v(lo) <= _v(v)[:2] < _v(hi):
            return Check("python", "fail", f"{v}; verl 0.9.1 needs >={lo},<{hi}", f"use Python {gpu}")
    return Check("python", "pass", v)


def check_torch(pins: _Pins) -> tuple[Check, Any]:
    if _dist_version("torch") is None:
        return Check(
            "torch",
            "fail",
            "not installed",
            f"pip install torch=={pins.gpu.get('torch', '2.11.0')} --index-url {_TORCH_INDEX}",
        ), None
    try:
        import torch
    except Exception as e:  # a broken install: say so instead of a traceback
        return Check("torch", "fail", f"import failed: {e}", "reinstall torch from the pinned index"), None
    v = torch.__version__
    cuda = torch.version.cuda
    want = pins.gpu.get("torch") if cuda else (pins.cpu_torch or pins.gpu.get("torch"))
    detail = f"{v} (CUDA runtime {cuda or 'none: CPU build'})"
    if want and _v(v)[:3] != _v(want)[:3]:
        return Check("torch", "warn", f"{detail}; pinned {want}", f"pip install torch=={want}"), torch
    return Check("torch", "pass", detail), torch


class _NV:
    """NVML, or why not."""

    def __init__(self) -> None:
        self.nv: Any = None
        self.error = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception as e:
            self.error = f"NVML: {e}"

    def count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount()) if self.nv else 0


def check_driver(nv: _NV, torch: Any, pins: _Pins, need_gpu: bool) -> Check:
    if nv.nv is None:
        return Check(
            "driver",
            "fail" if need_gpu else "warn",
            f"no NVIDIA driver ({nv.error})",
            "install the NVIDIA driver >= " + pins.min_cuda13 + " and run the container with --gpus all",
        )
    s = nv.nv.nvmlSystemGetDriverVersion()
    driver = s.decode() if isinstance(s, bytes) else str(s)
    cv = int(nv.nv.nvmlSystemGetCudaDriverVersion_v2())
    drv_cuda = (cv // 1000, (cv % 1000) // 10)
    runtime = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    detail = f"driver {driver} (supports CUDA {drv_cuda[0]}.{drv_cuda[1]}), torch CUDA runtime {runtime or 'none'}"
    if runtime:
        rt = _v(runtime)
        if rt[0] >= 13 and _v(driver) < _v(pins.min_cuda13):
            return Check(
                "driver",
                "fail",
                detail + f"; CUDA 13 needs driver >= {pins.min_cuda13}",
                f"upgrade the NVIDIA driver to >= {pins.min_cuda13}",
            )
        if drv_cuda < (rt[0], 0):
            return Check("driver", "fail", detail, f"upgrade the driver to one that supports CUDA {runtime}")
        want = pins.gpu.get("cuda")
        if want and rt[:2] != _v(want)[:2]:
            return Check(
                "driver",
                "warn",
                detail + f"; pinned CUDA {want}",
                f"install the cu{want.replace('.', '')} torch wheel from {_TORCH_INDEX}",
            )
    elif torch is not None and nv.count() > 0:
        return Check(
            "driver",
            "fail",
            detail + "; torch is a CPU build on a GPU host",
            f"pip install torch=={pins.gpu.get('torch', '2.11.0')} --index-url {_TORCH_INDEX}",
        )
    return Check("driver", "pass", detail)


def check_gpus(nv: _NV, torch: Any, recipe: Any) -> list[Check]:
    need = bool(recipe is not None and recipe.needs_gpu)
    n = nv.count()
    if n == 0:
        why = nv.error or "NVML sees no GPU"
        if need:
            return [
                Check(
                    "gpu",
                    "fail",
                    f"recipe {recipe.id} trains on NVIDIA GPUs; this host has none ({why})",
                    f"run on a host with NVIDIA GPUs (docker run --gpus all), or rehearse on CPU: "
                    f"verl-recipes train {recipe.id}",
                )
            ]
        return [
            Check(
                "gpu",
                "warn",
                f"no GPU ({why}); only CPU previews can run here",
                "run on a host with NVIDIA GPUs (docker run --gpus all) to train",
            )
        ]
    out: list[Check] = []
    nvm = nv.nv
    for i in range(n):
        h = nvm.nvmlDeviceGetHandleByIndex(i)
        name = nvm.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        total = nvm.nvmlDeviceGetMemoryInfo(h).total / GIB
        notes: list[str] = []
        status: Status = "pass"
        fix = ""
        try:
            ecc = nvm.nvmlDeviceGetEccMode(h)[0]
            notes.append("ECC on" if ecc else "ECC off")
            if ecc:
                ue = nvm.nvmlDeviceGetTotalEccErrors(h, nvm.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvm.NVML_VOLATILE_ECC)
                if ue:
                    status, fix = "warn", "uncorrected ECC errors since boot: drain the GPU / reset it"
                    notes.append(f"{ue} uncorrected ECC errors")
        except nvm.NVMLError:
            notes.append("ECC n/a")
        try:
            if nvm.nvmlDeviceGetMigMode(h)[0]:
                status, fix = (
                    "warn",
                    "MIG is on: verl/vLLM see slices; disable MIG (nvidia-smi -mig 0) for the recipes",
                )
                notes.append("MIG on")
            else:
                notes.append("MIG off")
        except nvm.NVMLError:
            notes.append("MIG n/a")
        out.append(Check(f"gpu{i}", status, f"{name}, {total:.1f} GiB, {', '.join(notes)}", fix))
    if torch is not None and getattr(torch.version, "cuda", None):
        try:
            tc = torch.cuda.device_count()
        except Exception as e:
            tc = 0
            out.append(Check("gpu-torch", "fail", f"torch cannot see the GPUs: {e}", "check the driver check above"))
        if tc == 0:
            out.append(
                Check(
                    "gpu-torch",
                    "fail",
                    f"NVML sees {n} GPU(s), torch sees none",
                    "match torch's CUDA to the driver (see the driver check); check CUDA_VISIBLE_DEVICES",
                )
            )
    return out


def check_nccl(torch: Any, n_gpus: int, allreduce: bool) -> list[Check]:
    if torch is None or not getattr(torch.version, "cuda", None) or n_gpus == 0:
        return []
    try:
        v = torch.cuda.nccl.version()
        ver = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        return [Check("nccl", "fail", f"torch has no NCCL: {e}", "install the CUDA build of torch")]
    out = [Check("nccl", "pass", f"NCCL {ver}")]
    n = torch.cuda.device_count()
    if n >= 2 and allreduce:
        out.append(_allreduce_check(n))
    elif n < 2:
        out.append(Check("nccl-allreduce", "pass", "skipped: one GPU"))
    return out


_WORKER = """
import json, os, sys, time, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=world)
x = torch.full((64 * 2**20,), float(rank + 1), device="cuda")  # 256 MiB of fp32
dist.all_reduce(x); torch.cuda.synchronize()
ok = bool(torch.all(x == world * (world + 1) / 2).item())
t = time.perf_counter()
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / 5
if rank == 0:
    print(json.dumps({"ok": ok, "busbw_gbs": x.numel() * 4 * 2 * (world - 1) / world / dt / 1e9}))
dist.destroy_process_group()
"""


def _allreduce_check(world: int, timeout: float = 180.0) -> Check:
    """A real NCCL all-reduce, one process per GPU, in fresh processes (as Ray's workers are)."""
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "allreduce.py"
        script.write_text(_WORKER)
        port = 29500 + os.getpid() % 1000
        procs = []
        for rank in range(world):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + timeout
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                return Check(
                    "nccl-allreduce",
                    "fail",
                    f"all-reduce across {world} GPUs hung for {timeout:.0f} s",
                    "run with NCCL_DEBUG=INFO; check /dev/shm, --ipc=host and the GPU topology",
                )
    if any(p.returncode for p in procs):
        err = next(e for (_, e), p in zip(outs, procs, strict=True) if p.returncode).strip().splitlines()
        return Check(
            "nccl-allreduce",
            "fail",
            f"all-reduce failed: {err[-1] if err else '?'}",
            "run with NCCL_DEBUG=INFO; check /dev/shm size and --ipc=host",
        )
    res = json.loads(outs[0][0].strip().splitlines()[-1])
    if not res["ok"]:
        return Check("nccl-allreduce", "fail", "all-reduce gave a wrong sum", "report this GPU/driver combination")
    return Check("nccl-allreduce", "pass", f"{world} GPUs, right sum, bus bandwidth {res['busbw_gbs']:.0f} GB/s")


# package -> why it is needed; the pins are images/versions.toml [gpu]
_PACKAGES = ("verl", "transformers", "tensordict", "ray", "vllm", "peft", "deepspeed")


def check_packages(pins: _Pins, recipe: Any, gpu_host: bool) -> list[Check]:
    out = []
    for name in _PACKAGES:
        have = _dist_version(name)
        want = pins.gpu.get(name)
        required = name in ("verl", "transformers", "tensordict", "ray") or (
            name == "vllm" and (gpu_host or (recipe is not None and recipe.needs_gpu))
        )
        if recipe is not None:
            required |= name == "peft" and recipe.model.lora_rank > 0
            required |= name == "deepspeed" and recipe.backend == "deepspeed"
        if have is None:
            why = "needed" if required else "not needed here"
            pin = f"=={want}" if want else ""
            out.append(
                Check(name, "fail" if required else "warn", f"not installed ({why})", f"pip install {name}{pin}")
            )
        elif want and _v(have)[:3] != _v(want)[:3]:
            core = name == "verl"  # the recipes are written against verl 0.9.1's config and code
            out.append(Check(name, "fail" if core else "warn", f"{have}; pinned {want}", f"pip install {name}=={want}"))
        else:
            out.append(Check(name, "pass", have + ("" if want else " (no exact pin)")))
    return out


def check_megatron(pins: _Pins, recipe: Any) -> list[Check]:
    """The Megatron stack a `backend: megatron` recipe needs on top of the lock (versions.toml
    [megatron]). Transformer Engine half-installed is worse than absent: its meta package without
    the torch extension makes `import megatron.core` itself fail (gpu/megatron-notes.md), so a
    partial TE is a failure of its own."""
    if recipe is None or recipe.backend != "megatron":
        return []
    fix = "carry them: verl-recipes wheelhouse --with megatron --local-wheels DIR (gpu/megatron-notes.md)"
    if not pins.megatron:
        return [Check("megatron", "warn", f"no [megatron] pins in {pins.source}", "set VERL_RECIPES_ROOT=checkout")]
    out = []
    for name, want in pins.megatron.items():
        have = _dist_version(name)
        if have is None:
            out.append(Check(name, "fail", f"not installed (needed by recipe {recipe.id}, Megatron backend)", fix))
        elif _v(have)[:3] != _v(want)[:3]:
            out.append(Check(name, "fail", f"{have}; pinned {want}", fix))
        else:
            out.append(Check(name, "pass", have))
    te = [n for n in pins.megatron if n.startswith("transformer-engine")]
    present = [n for n in te if _dist_version(n) is not None]
    if present and len(present) != len(te):
        missing = ", ".join(n for n in te if n not in present)
        out.append(
            Check(
                "te-complete",
                "fail",
                f"Transformer Engine half installed: {missing} missing, which breaks `import megatron.core`",
                "install all three transformer-engine packages in one pip call, or none",
            )
        )
    return out


def check_flash_attn() -> Check:
    v = _dist_version("flash-attn") or _dist_version("flash_attn")
    if v:
        return Check("flash-attn", "pass", f"{v} installed; the recipes still set attn_implementation=sdpa")
    return Check(
        "flash-attn",
        "pass",
        "absent (no PyPI wheel); the recipes use attn_implementation=sdpa, use_remove_padding=false",
    )


def _ram_gib() -> float:

    return psutil.virtual_memory().total / GIB


def check_shm() -> Check:
    try:
        st = os.statvfs("/dev/shm")
    except OSError as e:
        return Check("shm", "fail", f"/dev/shm: {e}", "mount a tmpfs on /dev/shm (docker run --shm-size=...)")
    size = st.f_blocks * st.f_frsize
    want = max(8, math.ceil(_ram_gib() * 0.3))  # Ray's object store defaults to 30% of RAM, in /dev/shm
    detail = f"/dev/shm {size / GIB:.2f} GiB"
    if size < _SHM_MIN:
        return Check(
            "shm",
            "fail",
            detail + " (Docker's 64 MB default breaks Ray's object store and NCCL)",
            f"docker run --shm-size={want}g (or --ipc=host)",
        )
    if size < want * GIB * 0.99:
        return Check("shm", "warn", detail + f"; Ray wants ~30% of RAM ({want} GiB)", f"docker run --shm-size={want}g")
    return Check("shm", "pass", detail)


def check_ulimits() -> list[Check]:
    out = []
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < _NOFILE_MIN:
        out.append(
            Check(
                "ulimit-n",
                "warn",
                f"open files {soft}; Ray opens many sockets per worker",
                "ulimit -n 1048576 (docker run --ulimit nofile=1048576:1048576)",
            )
        )
    else:
        out.append(Check("ulimit-n", "pass", f"open files {'unlimited' if soft == resource.RLIM_INFINITY else soft}"))
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != resource.RLIM_INFINITY:
        out.append(
            Check(
                "ulimit-l",
                "warn",
                f"locked memory {soft // 1024} KiB; NCCL over InfiniBand needs unlimited",
                "ulimit -l unlimited (docker run --ulimit memlock=-1:-1)",
            )
        )
    else:
        out.append(Check("ulimit-l", "pass", "locked memory unlimited"))
    return out


def check_host_ram() -> Check:
    """MemTotal and what is available now: a fact of the host. Whether a run's host RAM (the
    planner's figure for it) fits is `train`'s pre-flight's question, asked of the job itself."""

    vm = psutil.virtual_memory()
    return Check("host-ram", "pass", f"{vm.total / GIB:.1f} GiB total, {vm.available / GIB:.1f} GiB available")


#: GiB a run wants on disk beside any weights: config, tokenizer, logs, samples, compile caches
DISK_FLOOR_GIB = 20.0


def disk_need(recipe: Any, weights: bool = True) -> tuple[float, str]:
    """GiB of disk a run wants, and what for. With `weights` False (a checkpoint written without
    weights, as a Megatron rank rehearsal at 70B widths trains from: Megatron initialises them and
    vLLM draws dummy ones) neither the model nor a copy of it lands on disk: the floor only."""
    if recipe is None or not weights:
        return DISK_FLOOR_GIB, "the run's logs, samples and caches"
    # model download + one checkpoint (bf16 weights, LoRA or not): ~3x the bf16 weights. A heuristic.
    return max(DISK_FLOOR_GIB, recipe.model.params * 2 * 3 / GIB), "the model and checkpoints"


def check_disk(recipe: Any, path: Path, weights: bool = True) -> Check:
    """Free disk at `path` against what the run writes (`disk_need`)."""
    free = shutil.disk_usage(path).free / GIB
    need, what = disk_need(recipe, weights)
    detail = f"{free:.0f} GiB free at {path}"
    if free < need:
        return Check(
            "disk",
            "warn",
            detail + f"; want >= {need:.0f} GiB for {what}",
            "free disk space or point HF_HOME and trainer.default_local_dir at a larger disk",
        )
    return Check("disk", "pass", detail)


def run_checks(recipe_id: str | Any | None = None, allreduce: bool = True, weights: bool = True) -> list[Check]:
    """All checks, in the order they are printed; `recipe_id` is a recipe's id or its `Recipe`;
    `weights` False for a run whose checkpoint has none (`check_disk`)."""
    checks: list[Check] = []
    pins, why = _load_pins()
    if why:
        checks.append(
            Check(
                "pins",
                "warn",
                f"no checkout ({why}); pins from {pins.source}",
                "set VERL_RECIPES_ROOT=/path/to/checkout for the full pins",
            )
        )
    recipe, rc = _recipe(recipe_id)
    if rc:
        checks.append(rc)
    need_gpu = bool(recipe is not None and recipe.needs_gpu)
    checks.append(check_python(pins))
    tc, torch = check_torch(pins)
    checks.append(tc)
    nv = _NV()
    checks.append(check_driver(nv, torch, pins, need_gpu))
    checks += check_gpus(nv, torch, recipe)
    checks += check_nccl(torch, nv.count(), allreduce)
    checks += check_packages(pins, recipe, nv.count() > 0)
    checks += check_megatron(pins, recipe)
    checks.append(check_flash_attn())
    checks.append(check_shm())
    checks += check_ulimits()
    checks.append(check_host_ram())
    checks.append(check_disk(recipe, Path.cwd(), weights))
    return checks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check the install, GPUs, driver and host against the pins",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--recipe", help="also check what this recipe needs (GPUs, memory, packages)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--no-allreduce", action="store_true", help="skip the multi-GPU NCCL all-reduce")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checks = run_checks(args.recipe, allreduce=not args.no_allreduce)
    failed = [c for c in checks if c.status == "fail"]
    if args.json:
        print(json.dumps({"ok": not failed, "recipe": args.recipe, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print_checks(checks)
    return 1 if failed else 0


def print_checks(checks: list[Check], indent: str = "") -> None:
    """The checks as `verify` prints them: one line each, the fix under a warn or fail, then a tally."""
    for c in checks:
        line = f"{indent}{c.status.upper():4s}  {c.name:15s} {c.detail}"
        print(line + (f"\n{indent}      {'':15s} fix: {c.fix}" if c.fix and c.status != "pass" else ""))
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    print(f"\n{indent}{failed} failed, {warned} warnings, {len(checks) - failed - warned} passed")
