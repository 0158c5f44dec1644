"""The planner against measured runs: `verl-recipes plan --validate` / `nox -s validate-planner`.

Every committed run `recipes/<id>/results/<run>/summary.json` (written by `verl_recipes.report`)
is re-planned from the configuration it ran (`verl_config.yaml` beside it when present, else the
recipe composed with the run's variants and `--set`s) on the GPU it ran on (its total memory as
NVML reported it), and every measured phase peak on every GPU is compared:

    error = (predicted - measured) / measured

A run fails the check when |error| exceeds the tolerance (10% by default) for any phase on any
GPU. No runs at all is a failure too, unless `--allow-empty`: a planner nobody has checked must
not look validated. The mean residual per phase is printed as the data to refit the constants in
`phases.Constants` (per-process CUDA context, vLLM graphs, NCCL) from.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_recipes import ARCHS_DIR, RecipeError
from verl_recipes.plan.gpus import GIB, GPU
from verl_recipes.plan.model import Arch
from verl_recipes.plan.phases import Constants, plan_gpu

SUMMARY = "summary.json"
# Phase names a report may use for the planner's phases.
_ALIASES = {"init": "loaded", "startup": "loaded", "model_loaded": "loaded", "before_step_1": "loaded",
            "sync": "update_weights", "weight_sync": "update_weights"}  # fmt: skip
_PEAK_KEYS = ("gpu_peak_bytes", "per_gpu_peak_bytes", "peak_bytes_per_gpu", "peak_used_bytes", "peak_bytes")


@dataclass
class MeasuredRun:
    path: Path  # the summary.json
    recipe: str
    variants: list[str]
    sets: list[str]
    gpu_total_bytes: int | None
    gpu_name: str
    phases: dict[str, dict[int, int]]  # phase -> GPU index -> peak device bytes
    tokens_per_s: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    run: str
    phase: str
    gpu: int
    measured: int
    predicted: int

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else float("inf")


def _peaks(val: Any) -> dict[int, int]:
    """One phase's peak per GPU index from the forms a summary may use."""
    if isinstance(val, (int, float)):
        return {0: int(val)}
    if isinstance(val, list):
        return {i: int(v) for i, v in enumerate(val) if isinstance(v, (int, float))}
    if isinstance(val, dict):
        for k in _PEAK_KEYS:
            if k in val:
                return _peaks(val[k])
        if val and all(str(k).isdigit() for k in val):
            return {int(k): int(v) for k, v in val.items() if isinstance(v, (int, float))}
    return {}


def _gpu_total(run_dir: Path, summary: dict[str, Any]) -> tuple[int | None, str]:
    for key in ("gpus", "gpu"):
        g = summary.get(key)
        if isinstance(g, list) and g:
            g = g[0]
        if isinstance(g, dict) and g.get("total_bytes"):
            return int(g["total_bytes"]), str(g.get("name", ""))
    samples = run_dir / "samples.jsonl"  # the monitor's start record
    if samples.is_file():
        with samples.open() as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("kind") == "start" and rec.get("gpus"):
                    g0 = rec["gpus"][0]
                    return int(g0["total_bytes"]), str(g0.get("name", ""))
                break
    return None, ""


def read_run(path: Path) -> MeasuredRun:
    try:
        s = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecipeError(f"{path}: not readable JSON: {e}") from None
    phases_raw = s.get("phases") or {}
    phases: dict[str, dict[int, int]] = {}
    if isinstance(phases_raw, list):
        for item in phases_raw:
            name = _ALIASES.get(str(item.get("name")), str(item.get("name")))
            phases.setdefault(name, {}).update(_peaks(item))
    else:
        for name, val in phases_raw.items():
            phases[_ALIASES.get(str(name), str(name))] = _peaks(val)
    total, name = _gpu_total(path.parent, s)
    tps = s.get("tokens_per_s")
    if tps is None and isinstance(s.get("throughput"), dict):
        tps = s["throughput"].get("tokens_per_s")
    recipe = str(s.get("recipe") or path.parent.parent.parent.name)
    return MeasuredRun(path, recipe, list(s.get("variants") or []), list(s.get("sets") or []), total, name,
                       {k: v for k, v in phases.items() if v}, float(tps) if tps else None, s)  # fmt: skip


def measured_runs(root: Path | None = None) -> list[MeasuredRun]:
    from verl_recipes.paths import repo_root

    base = root or repo_root()
    return [read_run(p) for p in sorted(base.glob(f"recipes/*/results/*/{SUMMARY}"))]


def _run_setup(run: MeasuredRun) -> Any:
    """The Setup the run trained with: its saved verl config when present, else recomposed."""
    from omegaconf import OmegaConf

    from verl_recipes.plan.cli import load_setup
    from verl_recipes.plan.inputs import setup_from_config

    arch_cfg = run.raw.get("arch_config")
    model_cfg = run.path.parent / "model_config.json"
    saved = run.path.parent / "verl_config.yaml"
    if isinstance(arch_cfg, dict):
        arch = Arch.from_config(arch_cfg, f"{run.path}: arch_config")
    elif model_cfg.is_file():
        arch = Arch.from_file(model_cfg)
    else:
        from verl_recipes.recipes import get_recipe

        arch = Arch.from_file(ARCHS_DIR / get_recipe(run.recipe).model.arch / "config.json")
    if saved.is_file():
        return setup_from_config(OmegaConf.load(saved), arch)
    return load_setup(run.recipe, run.variants, run.sets)[1]


def validate_all(root: Path | None = None, tolerance: float = 0.10, c: Constants | None = None) -> tuple[list[Row], bool]:
    """Predicted vs measured for every committed run: (rows, every |error| <= tolerance)."""
    rows: list[Row] = []
    for run in measured_runs(root):
        if not run.phases:
            raise RecipeError(f"{run.path}: no per-phase GPU peaks in it; regenerate it with verl-recipes report")
        if not run.gpu_total_bytes:
            raise RecipeError(f"{run.path}: no GPU total memory in it or in samples.jsonl beside it")
        setup = _run_setup(run)
        gpu = GPU(id=run.gpu_name or "measured", name=run.gpu_name, memory_bytes=run.gpu_total_bytes,
                  visible_bytes=run.gpu_total_bytes)  # fmt: skip
        plan = plan_gpu(setup, gpu, c)
        label = str(run.path.parent.relative_to(run.path.parents[3]))
        for phase, per_gpu in sorted(run.phases.items()):
            pp = plan.phase(phase)
            if pp is None:
                continue  # a phase the planner does not model (reward, adv, testing, ...)
            for idx, measured in sorted(per_gpu.items()):
                rows.append(Row(label, phase, idx, measured, pp.total))
    ok = bool(rows) and all(abs(r.error) <= tolerance for r in rows)
    return rows, ok


def format_table(rows: list[Row], tolerance: float) -> str:
    out = [f"{'run':40s} {'phase':15s} {'gpu':>3s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in rows:
        flag = "" if abs(r.error) <= tolerance else "  FAIL"
        out.append(f"{r.run:40s} {r.phase:15s} {r.gpu:3d} {r.measured / GIB:9.2f} {r.predicted / GIB:9.2f} "
                   f"{r.error:+7.1%}{flag}")  # fmt: skip
    by_phase: dict[str, list[int]] = {}
    for r in rows:
        by_phase.setdefault(r.phase, []).append(r.measured - r.predicted)
    if by_phase:
        out.append("mean residual (measured - predicted), GiB, to refit phases.Constants from: " + ", ".join(
            f"{p} {statistics.mean(v) / GIB:+.2f}" for p, v in sorted(by_phase.items())))  # fmt: skip
    return "\n".join(out)


def main_validate(tolerance: float = 0.10, allow_empty: bool = False, root: Path | None = None) -> int:
    if not 0 < tolerance < 1:
        raise RecipeError(f"--tolerance {tolerance}: give a fraction such as 0.10")
    rows, ok = validate_all(root, tolerance)
    if not rows:
        msg = ("validate-planner: no measured runs found (recipes/*/results/*/summary.json); "
               "the planner is unvalidated")  # fmt: skip
        print(msg + ("; passing because of --allow-empty" if allow_empty else ""))
        return 0 if allow_empty else 1
    print(format_table(rows, tolerance))
    bad = [r for r in rows if abs(r.error) > tolerance]
    print(f"{len(rows)} comparisons, {len(bad)} beyond ±{tolerance:.0%}: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1
