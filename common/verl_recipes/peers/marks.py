"""A peer's phases and step metrics in the run folder's formats, from wrappers around its own functions.

verl's phases come from its own timer (`worker.markers`); a peer has other names for other cuts
of a step. The launchers wrap the functions that make each phase (TRL's vLLM generate and weight
sync, OpenRLHF's generate_samples, make_experience_batch, ppo_train, broadcast_to_vllm) so that
each call also writes a begin and an end line to phases.jsonl, with the step it belongs to; the
wrapped function runs unchanged, with the same arguments, and its result or exception passes
through. At a step's end one metrics.jsonl line gives the step's own time, its tokens and the
rate per GPU under verl's names (`timing_s/step`, `perf/total_num_tokens`, `perf/throughput`), so
`verl-recipes report` reads a peer's run folder as it reads verl's.

The phase names a peer's steps get, and the table's column each one counts toward
(`peers.table.COLUMNS`): `gen` (its rollout engine generating), `score` (the rest of making the
batch: log-probs of the old and the reference policy, rewards, advantages), `update_actor` (the
optimizer's pass over the batch), `update_weights` (the sync of the trained weights into the
rollout engine), `step` (the step's span). A phase may nest in another (TRL's gen inside its
score); the report gives each sample to the innermost phase open.

Standard library only at load time: this runs inside the peer's environment, which has neither
verl nor our stack, and inside its Ray workers.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from verl_recipes import rundir
from verl_recipes.worker.markers import device_used, metrics_record, phase_record

#: the phase names a peer's launcher may write (module docstring)
PHASES = ("gen", "score", "update_actor", "update_weights", "step")


class Steps:
    """The step a phase belongs to, counted where the peer's loop starts a step (1, 2, ...), the
    tokens each step processed and the time each phase took in it, exclusive of the phases nested
    in it (TRL's gen inside its score), for the step's metrics line."""

    def __init__(self, gpus: int = 1) -> None:
        self.step = 0
        self.gpus = gpus
        self.begun = 0.0
        self.tokens = 0
        self.spent: dict[str, float] = {}
        self._open: list[list[float]] = []  # [begin, time of the phases nested in it] per open phase

    def begin(self, t: float | None = None) -> int:
        """A new step, begun at `t` (now if None)."""
        self.step += 1
        self.begun = time.time() if t is None else t
        self.tokens = 0
        self.spent = {}
        rundir.append(rundir.PHASES, phase_record("begin", "step", self.step, self.begun, os.getpid()))
        return self.step

    def add_tokens(self, n: int) -> None:
        self.tokens += int(n)

    def open(self, name: str) -> None:
        t = time.time()
        self._open.append([t, 0.0])
        rundir.append(rundir.PHASES, phase_record("begin", name, self.step or None, t, os.getpid()))

    def close(self, name: str, ok: bool) -> None:
        t = time.time()
        begun, nested = self._open.pop()
        self._spend(name, t - begun, nested)
        end = phase_record("end", name, self.step or None, t, os.getpid(), ok=ok, gpu_used=device_used())
        rundir.append(rundir.PHASES, end)

    def record(self, name: str, t0: float, t1: float, ok: bool = True) -> None:
        """A phase whose span is known only once it is over (lines written afterwards)."""
        self._spend(name, t1 - t0, 0.0)
        rundir.append(rundir.PHASES, phase_record("begin", name, self.step, t0, os.getpid()))
        rundir.append(rundir.PHASES, phase_record("end", name, self.step, t1, os.getpid(), ok=ok))

    def _spend(self, name: str, dt: float, nested: float) -> None:
        self.spent[name] = self.spent.get(name, 0.0) + dt - nested
        if self._open:
            self._open[-1][1] += dt

    def end(self, ok: bool = True, extra: dict[str, Any] | None = None) -> None:
        """The step's end line and its metrics line: the step's time, each phase's own time in it,
        the tokens and tokens/s per GPU."""
        t = time.time()
        end = phase_record("end", "step", self.step, t, os.getpid(), ok=ok, gpu_used=device_used())
        rundir.append(rundir.PHASES, end)
        dt = t - self.begun
        metrics: dict[str, Any] = {
            "training/global_step": self.step,
            **{f"timing_s/{k}": v for k, v in self.spent.items()},
            "timing_s/step": dt,
            "perf/time_per_step": dt,
            "perf/total_num_tokens": self.tokens,
        }
        if dt > 0 and self.tokens:
            metrics["perf/throughput"] = self.tokens / dt / self.gpus
        rundir.append(rundir.METRICS, metrics_record(self.step, {**metrics, **(extra or {})}, t, os.getpid()))


def phase(name: str, steps: Steps) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator for a peer's function: begin and end lines of phase `name` around each call, in
    the current step of `steps`. The call itself is untouched: same arguments, its result or its
    exception passed on."""
    if name not in PHASES or name == "step":
        raise ValueError(f"phase {name!r}: a peer's phase is one of {', '.join(PHASES[:-1])}")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(fn, "_verl_recipes_phase", None):
            return fn  # wrapped once, however often the launcher installs

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            steps.open(name)
            ok = False
            try:
                out = fn(*args, **kwargs)
                ok = True
                return out
            finally:
                steps.close(name, ok)

        inner._verl_recipes_phase = name  # type: ignore[attr-defined]
        return inner

    return wrap


def method(owner: Any, attr: str) -> Callable[..., Any]:
    """`owner.attr`, a method the launcher wraps; a missing one is another version of the peer
    than the launcher marks, said in one line."""
    fn = getattr(owner, attr, None)
    if fn is None:
        who = getattr(owner, "__qualname__", owner)
        raise RuntimeError(f"{who} has no {attr}: not the version of the peer the launcher marks")
    return fn


def wrap_method(owner: Any, attr: str, name: str, steps: Steps) -> None:
    """Replace `owner.attr` by its marked twin (`phase`)."""
    setattr(owner, attr, phase(name, steps)(method(owner, attr)))
