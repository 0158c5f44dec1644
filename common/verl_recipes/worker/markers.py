"""PPO phase markers and step metrics from inside verl, for the monitor's report.

The monitor samples memory from outside; to say *which phase* a peak belongs to we need verl's own
phase boundaries. verl 0.9.1's trainer (TaskRunnerV1 -> trainer_base/trainer_sync, and the legacy
ray_trainer) times every phase with `from verl.utils.debug import marked_timer` (step, gen, reward,
old_log_prob, ref, values, adv, update_critic, update_actor, update_weights, testing,
save_checkpoint) and logs each step's metrics through `verl.utils.tracking.Tracking.log`. We wrap
both, without forking verl:

- `marked_timer` keeps verl's behaviour (timing_raw is filled by verl's own timer) and also appends
  {"t", "event": "begin"|"end", "name", "step", "pid"} (+ "ok" on end) to
  $VERL_RECIPES_RUN_DIR/phases.jsonl. The step is the caller's `self.global_steps` (verl's trainer
  calls marked_timer from its own methods; during step N it holds N, the step Tracking.log gets).
- each `end` line also carries "gpu_used": {NVML index: device used bytes} read at that moment
  (when NVML is there): memory taken in the last instant of a phase (vLLM's KV cache coming back
  at the very end of update_weights) is otherwise seen only by the monitor's next 10 Hz sample,
  which falls in the next phase. The report counts this reading as a sample of the ending phase.
- `Tracking.log` also appends {"t", "step", "pid", "metrics": {name: number}} to
  $VERL_RECIPES_RUN_DIR/metrics.jsonl (perf/max_memory_reserved_gb, timing_s/*, perf/throughput...).

`install()` patches modules that are already imported (rebinding `marked_timer` in every imported
verl module that bound the original) and registers an import hook that patches
verl.utils.profiler and verl.utils.tracking when they are imported later. It imports nothing from
verl itself: a Ray worker that never uses verl pays nothing, and torch is not imported before Ray
has set CUDA_VISIBLE_DEVICES.

Wiring: the trainer loop runs in a Ray actor, so `install()` runs from Ray's worker setup hook
(`verl_recipes.worker.hooks.setup`, which the launcher puts into verl's ray_init.runtime_env) in
every worker whose environment carries VERL_RECIPES_RUN_DIR. Each line goes through
verl_recipes.rundir.append: one write(2) to an O_APPEND file, so several processes may write and a
kill loses nothing already written.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import Any

from verl_recipes import rundir
from verl_recipes.rundir import RUN_DIR_ENV
from verl_recipes.worker import gen_split
from verl_recipes.worker.import_hooks import after_import

#: the phase names verl 0.9.1's v1 trainer gives `marked_timer` in one PPO/GRPO step.
VERL_PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "step",
)

# verl modules that define or re-export marked_timer (verl.utils.debug re-exports the profiler's).
_TIMER_MODULES = ("verl.utils.profiler", "verl.utils.debug")
_TRACKING_MODULE = "verl.utils.tracking"
_MARK = "_verl_recipes_wrapped"


def _caller_step(frame: FrameType | None) -> int | None:
    """verl's global step from the nearest caller frame whose `self` has `global_steps`."""
    for _ in range(6):
        if frame is None:
            return None
        obj = frame.f_locals.get("self")
        step = getattr(obj, "global_steps", None) if obj is not None else None
        if isinstance(step, int):
            return step
        frame = frame.f_back
    return None


_NVML: list[Any] = []  # [pynvml module, [(index, handle)]] once initialised; [None] if unavailable


def device_used() -> dict[str, int] | None:
    """Device used memory per NVML index now (every GPU: Ray hides GPUs from the trainer actor's
    CUDA_VISIBLE_DEVICES, so no narrowing here; the report keeps the GPUs the monitor watched)."""
    if not _NVML:
        try:
            import pynvml as nv

            nv.nvmlInit()
            _NVML.extend([nv, [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]])
        except Exception:  # no NVML library or no driver: phases still work, without readings
            _NVML.append(None)
    if _NVML[0] is None:
        return None
    nv, handles = _NVML
    try:
        out = {}
        for i, h in handles:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out[str(i)] = int(mem.total - mem.free)
        return out
    except Exception:
        return None


def phase_record(
    event: str,
    name: str,
    step: int | None,
    t: float,
    pid: int,
    ok: bool | None = None,
    gpu_used: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One line of phases.jsonl: `begin` or `end` of phase `name` in `step`, at time.time() `t`.

    The one spelling of the format: the markers inside verl write it, and so does a run of another
    training loop that derives the same lines from its own phase intervals (recipe
    verl-vs-deepspeed's DeepSpeed loop), so `verl-recipes report` reads both alike."""
    rec: dict[str, Any] = {"t": t, "event": event, "name": name, "step": step, "pid": pid}
    if event == "end":
        rec["ok"] = bool(ok)
        if gpu_used is not None:
            rec["gpu_used"] = gpu_used
    return rec


def metrics_record(step: int | None, metrics: dict[str, Any], t: float, pid: int) -> dict[str, Any]:
    """One line of metrics.jsonl: a step's metrics as JSON numbers (NaN, inf and anything that is
    not a number left out); written as `phase_record` is, by verl's Tracking.log and by another loop."""
    numbers = {str(k): _number(v) for k, v in metrics.items()}
    return {"t": t, "step": step, "pid": pid, "metrics": {k: v for k, v in numbers.items() if v is not None}}


class _PhaseTimer:
    """Wraps verl's timer context: a begin line, verl's own timing, an end line (also on error)."""

    def __init__(self, inner: Any, name: str, step: int | None) -> None:
        self.inner, self.name, self.step = inner, name, step

    def __enter__(self) -> Any:
        rundir.append(rundir.PHASES, phase_record("begin", self.name, self.step, time.time(), os.getpid()))
        return self.inner.__enter__()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> Any:
        try:
            return self.inner.__exit__(et, ev, tb)
        finally:
            rec = phase_record("end", self.name, self.step, time.time(), os.getpid(), et is None, device_used())
            rundir.append(rundir.PHASES, rec)


def _wrap_timer(orig: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(orig, _MARK, False):
        return orig

    def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> _PhaseTimer:
        return _PhaseTimer(orig(name, timing_raw, *args, **kwargs), name, _caller_step(sys._getframe(1)))

    marked_timer.__doc__ = orig.__doc__
    marked_timer.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(marked_timer, _MARK, True)
    return marked_timer


def _number(v: Any) -> float | int | None:
    """A metric value as a JSON number, or None (NaN, inf, tables, strings)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if hasattr(v, "item") and getattr(v, "ndim", getattr(v, "dim", lambda: 0)) in (0, ()):
        try:
            v = v.item()
        except (ValueError, RuntimeError):
            return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _wrap_log(orig: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(orig, _MARK, False):
        return orig
    sig = inspect.signature(orig)

    def log(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
            data = bound.arguments.get("data") or {}
            step = bound.arguments.get("step")
            rundir.append(rundir.METRICS, metrics_record(step, dict(data), time.time(), os.getpid()))
        except Exception as e:  # never break training for a record; say why in the file
            rundir.append(rundir.METRICS, {"t": time.time(), "error": repr(e)[:300]})
        return orig(*args, **kwargs)

    log.__doc__ = orig.__doc__
    log.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(log, _MARK, True)
    return log


def _patch_timer_module(mod: ModuleType) -> None:
    orig = getattr(mod, "marked_timer", None)
    if orig is not None and not getattr(orig, _MARK, False):
        mod.marked_timer = _wrap_timer(orig)  # type: ignore[attr-defined]


def _patch_tracking_module(mod: ModuleType) -> None:
    cls = getattr(mod, "Tracking", None)
    if cls is not None and not getattr(cls.log, _MARK, False):
        cls.log = _wrap_log(cls.log)


def _rebind_imported() -> None:
    """Point every imported module's `marked_timer` name that holds verl's original at the wrapper.

    Not only verl's own modules: recipe code that did `from verl.utils.debug import marked_timer`
    before install() is rebound too.
    """
    originals: dict[int, Callable[..., Any]] = {}
    for name in _TIMER_MODULES:
        mod = sys.modules.get(name)
        fn = getattr(mod, "marked_timer", None) if mod else None
        if fn is not None and getattr(fn, _MARK, False):
            originals[id(fn.__wrapped__)] = fn
    if not originals:
        return
    for mod in list(sys.modules.values()):
        try:
            fn = mod.__dict__.get("marked_timer") if isinstance(mod, ModuleType) else None
        except Exception:  # a lazy module object with an odd __dict__
            continue
        if fn is not None and id(fn) in originals:
            mod.marked_timer = originals[id(fn)]  # type: ignore[attr-defined]


_HOOKS: dict[str, Callable[[ModuleType], None]] = {
    **{m: _patch_timer_module for m in _TIMER_MODULES},
    _TRACKING_MODULE: _patch_tracking_module,
}


def install() -> bool:
    """Patch verl's marked_timer and Tracking.log if VERL_RECIPES_RUN_DIR is set; idempotent.

    Returns whether the patch is active. Safe to call before or after verl is imported.
    """
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return False
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    for name, hook in _HOOKS.items():
        after_import(name, hook)
    _rebind_imported()

    gen_split.install()
    return True
