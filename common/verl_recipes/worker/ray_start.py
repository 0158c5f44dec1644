"""Start the one-host Ray cluster so that its prestarted workers serve verl's actors.

A Ray raylet prestarts one idle Python worker per CPU as it starts, so the first tasks and actors
need no new process. A worker serves only jobs with its own runtime_env, and the prestarted ones
have none. verl 0.9.1's `run_ppo` hands everything it sets (``TOKENIZERS_PARALLELISM``,
``VERL_FULL_DETERMINISM``, ``TRANSFER_QUEUE_ENABLE``, ...), with our worker setup hook, to
``ray.init`` as the job's runtime_env. So no prestarted worker is ever used: each actor waits for a
fresh one, started through Ray's runtime-env agent (``setup_worker.py``, then ``default_worker.py``).
The H200 7B runs show it: 16 idle workers up 15 s into the run and never used, and each of the
trainer actor, the TransferQueue controller and storage units, ``get_master_addr_port`` and the
reward workers waiting about 2 s for its own worker, one after another.

When verl's ``ray.init`` starts a local cluster (no address given, none in ``RAY_ADDRESS``), the
same variables can go into the driver's own environment instead: Ray starts its raylet, and the
raylet every worker, with the driver's environment, so each process sees exactly what the
runtime_env would have set, and the job's runtime_env is empty. Ray reads the setup hook from one
variable (``__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR``) in every worker it starts, so the hook goes
there too. Actors that set their own variables (verl's FSDP workers and vLLM servers) still get
their own workers, as before.

The cluster also starts without Ray's dashboard. ``ray.init`` waits for the dashboard process before
it starts the raylet; without it that process loads one module and no web frontend, and comes up
sooner. Nothing of a run reads the dashboard: the monitor reads the processes, and ``ray-logs/``
Ray's log files.

A runtime_env with anything but variables and a setup hook by module name (pip, a working_dir,
py_executable, nsight) is left to Ray, and so is a cluster that runs elsewhere: their workers do
not start from this driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: Ray 2.60's variable for the worker setup hook (ray._private.ray_constants), read by every worker.
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


def local_start(kwargs: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]] | str:
    """``ray.init``'s arguments and the driver variables that give its workers the same runtime env.

    Returns (new kwargs, variables to set), or the reason the call is left as it is.
    """
    if kwargs.get("address") or environ.get("RAY_ADDRESS"):
        return "Ray runs elsewhere (an address is given); its workers get the job's runtime_env"
    renv = dict(kwargs.get("runtime_env") or {})
    env_vars = renv.pop("env_vars", None) or {}
    hook = renv.pop("worker_process_setup_hook", None)
    rest = sorted(k for k, v in renv.items() if v is not None)
    if rest:
        return f"the runtime_env sets {', '.join(rest)}, which only Ray can apply"
    if hook is not None and not isinstance(hook, str):
        return "the setup hook is a callable, which only Ray can export"
    if environ.get(SETUP_HOOK_ENV) not in (None, hook):
        return f"{SETUP_HOOK_ENV} is already set to another hook"
    env = {str(k): str(v) for k, v in env_vars.items()}
    if hook:
        env[SETUP_HOOK_ENV] = hook
    new = {k: v for k, v in kwargs.items() if k != "runtime_env"}
    new.setdefault("include_dashboard", False)
    return new, env


def init(ray_init: Callable[..., Any], **kwargs: Any) -> Any:
    """``ray.init`` for verl's driver: a local cluster with the runtime_env in the environment."""
    plan = local_start(kwargs, os.environ)
    if isinstance(plan, str):
        print(f"verl_recipes: Ray starts with verl's runtime_env: {plan}", file=sys.stderr, flush=True)
        return ray_init(**kwargs)
    new, env = plan
    os.environ.update(env)
    names = ", ".join(sorted(env))
    print(f"verl_recipes: local Ray, no job runtime_env; driver environment: {names}", file=sys.stderr, flush=True)
    return ray_init(**new)


class RayLocalStart:
    """What verl's ``main_ppo`` sees as ``ray``: Ray itself, but ``init`` is `init` above."""

    def __init__(self, ray_module: Any) -> None:
        self._ray = ray_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        if args:  # verl passes keywords only; anything else is Ray's to read
            return self._ray.init(*args, **kwargs)
        return init(self._ray.init, **kwargs)
