"""Provenance of a run: what ran, where, with which versions, when.

Every measured number in the repository sits next to one of these records (MLPerf-style): a
number whose run cannot be re-created is a defect.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = (
    "verl",
    "vllm",
    "torch",
    "transformers",
    "tokenizers",
    "ray",
    "peft",
    "tensordict",
    "deepspeed",
    "nvidia-ml-py",
    "verl-recipes",
    # verl's Megatron backend: None where the [megatron] group is not installed
    "megatron-core",
    "megatron-bridge",
    "megatron-energon",
    "transformer-engine",
    "transformer-engine-torch",
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out


def gpus() -> dict[str, Any]:
    """GPU names, memory and driver from NVML; empty list when there is no GPU or no NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return {"driver": None, "cuda_driver": None, "gpus": [], "nvml_error": str(e)}
    try:
        n = pynvml.nvmlDeviceGetCount()
        devs = []
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devs.append(
                {
                    "index": i,
                    "name": name if isinstance(name, str) else name.decode(),
                    "memory_total_bytes": int(mem.total),
                }
            )
        drv = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "driver": drv if isinstance(drv, str) else drv.decode(),
            "cuda_driver": f"{cuda // 1000}.{(cuda % 1000) // 10}",
            "gpus": devs,
        }
    finally:
        pynvml.nvmlShutdown()


def git_commit(root: Path | None = None) -> str:
    env = os.environ.get("VERL_RECIPES_GIT_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


#: what `record` says of every run, in its order. A record kept inside another file (the DeepSpeed
#: loop of recipe verl-vs-deepspeed writes it into its run.json) is copied into a run's
#: provenance.json by these keys.
RECORD_KEYS = ("date_utc", "command", "argv", "host", "python", "platform", "packages", "gpu", "git_commit")


def record(command: list[str], extra: dict[str, Any] | None = None, root: Path | None = None) -> dict[str, Any]:
    values = (
        _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command,
        sys.argv,
        platform.node(),
        platform.python_version(),
        platform.platform(),
        package_versions(),
        gpus(),
        git_commit(root),
    )
    return {**dict(zip(RECORD_KEYS, values, strict=True)), **(extra or {})}
