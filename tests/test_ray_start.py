"""The `ray-local-start` fix: verl's local Ray start with its runtime_env in the driver's environment.

The end-to-end test runs verl 0.9.1's own `run_ppo` on a real local Ray (CPU), with a stand-in
TaskRunner, once as verl does it and once with the fix (tests/fixtures/ray_start_probe.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from verl_recipes.worker import ray_start

ROOT = Path(__file__).resolve().parents[1]
HOOK = "verl_recipes.worker.hooks.setup"


def _verl_kwargs() -> dict[str, object]:
    """ray.init's arguments as verl's run_ppo builds them for the 7b-lora job (its own code)."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    recipe = get_recipe("7b-lora")
    cfg = compose_run(recipe, None, [], gpu_layout(recipe, None))
    renv = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env)
    kwargs = OmegaConf.to_container(OmegaConf.create({**cfg.ray_kwargs.ray_init, "runtime_env": renv}))
    assert isinstance(kwargs, dict)
    return {str(k): v for k, v in kwargs.items()}


def test_verls_runtime_env_moves_whole_into_the_driver_environment() -> None:
    kwargs = _verl_kwargs()
    plan = ray_start.local_start(kwargs, {})
    assert not isinstance(plan, str), plan
    new, env = plan
    renv = kwargs["runtime_env"]
    assert isinstance(renv, dict)
    assert "runtime_env" not in new and new["include_dashboard"] is False
    assert env == {**renv["env_vars"], ray_start.SETUP_HOOK_ENV: HOOK}
    assert new["num_cpus"] == kwargs["num_cpus"]


@pytest.mark.parametrize(
    ("change", "environ", "why"),
    [
        ({"address": "10.0.0.1:6379"}, {}, "elsewhere"),
        ({}, {"RAY_ADDRESS": "10.0.0.1:6379"}, "elsewhere"),
        ({"runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"]}}, {}, "sets pip"),
        ({"runtime_env": {"working_dir": "/src"}}, {}, "sets working_dir"),
        ({}, {ray_start.SETUP_HOOK_ENV: "other.hook"}, "another hook"),
    ],
)
def test_what_only_ray_can_apply_is_left_to_ray(change: dict[str, object], environ: dict[str, str], why: str) -> None:
    kwargs = {**_verl_kwargs(), **change}
    plan = ray_start.local_start(kwargs, environ)
    assert isinstance(plan, str) and why in plan


def test_verl_start_skips_the_prestarted_workers_and_the_fix_uses_them(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common"), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "ray_start_probe.py"), str(tmp_path / "probe.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["mode"]: r for r in (json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{"))}
    verl, fixed = runs["verl"], runs["fixed"]
    # verl 0.9.1: the job carries a runtime_env, so the idle workers Ray prestarted never serve it,
    # and the full dashboard starts
    assert verl["job_runtime_env"]["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"
    assert verl["prestarted_worker_used"] is False
    assert verl["dashboard_full"] is True
    # fixed: no job runtime_env, the same variables and setup hook in the trainer actor, and a
    # prestarted worker serves the job's next actor
    assert fixed["job_runtime_env"] == {}
    assert fixed["TOKENIZERS_PARALLELISM"] == "true" and fixed["hook_ran"] is True
    assert fixed["prestarted_worker_used"] is True
    assert fixed["dashboard_full"] is False
    assert verl["hook_ran"] is True
