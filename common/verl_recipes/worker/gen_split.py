"""Where verl's `gen` phase goes: timestamps around its parts, in every process that runs one.

verl 0.9.1 times a step's rollout as one phase, `gen`. Inside it the driver hands the batch to the
agent-loop manager, which splits it over the agent-loop workers (Ray actors); each worker sends one
request per sequence to the vLLM server (another Ray actor, which runs vLLM's engine) and turns the
answers into tensors; then the driver puts the vLLM replicas to sleep. vLLM alone on the same work
takes about two thirds of `gen` on one H200 (`verl-recipes rollout-bench`), so the rest must be
found before it can be removed.

`install()` wraps, without forking verl, when each module is imported:
- ``dispatch``: ``AgentLoopManagerTQ.generate_sequences`` (the v1 trainer hands the prompts to the
  agent-loop workers, which start one task per sequence and return);
- ``request``: ``vLLMHttpServer.generate`` (one sequence inside the vLLM server's process);
- ``wait``: ``ReplayBuffer.sample`` (the trainer polling TransferQueue until the
  step's answers are all there);
- ``sleep``: ``CheckpointEngineManager.sleep_replicas`` (vLLM freeing its weights and KV cache).
Each call appends {"t0", "t1", "name", "pid", "ok"} to $VERL_RECIPES_RUN_DIR/gen_split.jsonl
(`rundir.GEN_SPLIT`) through `rundir.append` (one write per line, any number of processes);
`verl_recipes.measure.gen_split` reads them against the `gen` phases.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from verl_recipes import rundir
from verl_recipes.worker.import_hooks import after_import

_MARK = "_verl_recipes_gen_split"

#: verl 0.9.1 module -> (class, method, record name)
TARGETS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "verl.trainer.ppo.v1.agent_loop_tq": (("AgentLoopManagerTQ", "generate_sequences", "dispatch"),),
    "verl.workers.rollout.vllm_rollout.vllm_async_server": (("vLLMHttpServer", "generate", "request"),),
    "verl.trainer.ppo.v1.replay_buffer": (("ReplayBuffer", "sample", "wait"),),
    "verl.checkpoint_engine.base": (("CheckpointEngineManager", "sleep_replicas", "sleep"),),
}


def _record(name: str, t0: float, ok: bool) -> None:
    rundir.append(rundir.GEN_SPLIT, {"t0": t0, "t1": time.time(), "name": name, "pid": os.getpid(), "ok": ok})


async def _timed_await(name: str, t0: float, coro: Awaitable[Any]) -> Any:
    ok = False
    try:
        out = await coro
        ok = True
        return out
    finally:
        _record(name, t0, ok)


def timed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn` with a record of each call's start and end; coroutine functions stay coroutine functions
    (Ray decides from that whether an actor is async), and a plain function that hands back a
    coroutine (verl's `auto_await` called from a running loop) is timed until that is awaited."""
    if getattr(fn, _MARK, False):
        return fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _timed_await(name, time.time(), fn(*args, **kwargs))

        setattr(async_wrapper, _MARK, True)
        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        ok = False
        try:
            out = fn(*args, **kwargs)
            ok = True
        finally:
            if not ok:
                _record(name, t0, False)
        if inspect.iscoroutine(out):
            return _timed_await(name, t0, out)
        _record(name, t0, True)
        return out

    setattr(wrapper, _MARK, True)
    return wrapper


def timed_method(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`timed`, except for verl's `auto_await` methods, whose wrapper looks at its caller's frame
    to decide whether to hand back the coroutine (an awaiting caller) or run it: there the inner
    coroutine function is timed and `auto_await` applied again, so the caller it sees is the real one."""
    if getattr(fn, _MARK, False):
        return fn
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None and not inspect.iscoroutinefunction(fn) and inspect.iscoroutinefunction(inner):
        from verl.utils.ray_utils import auto_await

        wrapped = auto_await(timed(inner, name))
        setattr(wrapped, _MARK, True)
        return wrapped
    return timed(fn, name)


def _patcher(targets: tuple[tuple[str, str, str], ...]) -> Callable[[ModuleType], None]:
    def patch(mod: ModuleType) -> None:
        for cls_name, method, name in targets:
            cls = getattr(mod, cls_name, None)
            fn = cls.__dict__.get(method) if cls is not None else None
            if fn is not None:
                setattr(cls, method, timed_method(fn, name))

    return patch


_PATCHERS = {module: _patcher(targets) for module, targets in TARGETS.items()}


def install() -> bool:
    """Register the wrappers if VERL_RECIPES_RUN_DIR is set; idempotent, imports nothing of verl."""
    if not os.environ.get(rundir.RUN_DIR_ENV):
        return False
    for module, patch in _PATCHERS.items():
        after_import(module, patch)
    return True
