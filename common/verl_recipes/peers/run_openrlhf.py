"""OpenRLHF's launcher: `python3 -m verl_recipes.peers.run_openrlhf RUN_DIR`, in OpenRLHF's environment.

It writes the workload's prompts (`peers.data`) and the environment's packages (`peers.spec`),
starts Ray as OpenRLHF's own `train` would (the same three environment variables, with their
defaults) plus a worker setup hook, and runs OpenRLHF's `openrlhf.cli.train_ppo_ray` as
`__main__` on the command line `peers.openrlhf` composed; its `train` finds Ray started and
goes on. Three things are added, none changing what OpenRLHF computes:

- flash-attn: OpenRLHF 0.11.2 imports `flash_attn.bert_padding` and `flash_attn.utils.distributed`
  at module level (openrlhf/models/ring_attn_utils.py) and calls them only for packed samples and
  ring attention, which the runs leave off (flash-attn has no wheel: images/peers/openrlhf.toml).
  `stand_in_flash_attn` gives the import those names as functions that raise, naming what called
  them, so a run that reaches one stops and says so. It has no `__version__`, `__file__` or
  `ops`: Transformers sees no flash-attn installed, and OpenRLHF's fp32 log-prob path takes its
  own fallback (`from flash_attn.ops... import` in a try) as it does where flash-attn is absent.
- DeepSpeed's Adam: OpenRLHF asks DeepSpeed for "AdamW" by config, and DeepSpeed builds its
  FusedAdam (or, with --ds.adam_offload, DeepSpeedCPUAdam), C++/CUDA extensions compiled at first
  use; the host has no CUDA compiler (DeepSpeed 0.19.6, op_builder/builder.py: "CUDA_HOME does not
  exist, unable to compile CUDA op(s)"). Where torch finds no CUDA_HOME, `torch_adam_config` adds
  DeepSpeed's own `torch_adam: true` to the optimizer's config: torch's AdamW, the same update
  (and `zero_force_ds_cpu_optimizer: false`, which DeepSpeed asks for to run it on offloaded
  state). Recipe verl-vs-deepspeed's ZeRO-3 loop runs torch's AdamW for the same reason.
- the phase marks, in the PPOTrainer actor, through the setup hook (`worker_setup`, in every Ray
  worker; the marks are installed where OpenRLHF's trainer module is imported): a step is one
  turn of PPOTrainer.fit's loop, from SamplesGenerator.generate_samples (`gen`: the rollout,
  vLLM woken and put back to sleep, rewards scored in the engine) through BasePPOTrainer.train_step:
  RemoteExperienceMaker.make_experience_batch (`score`: the old policy's and the reference's
  log-probs, advantages), BasePPOTrainer.ppo_train (`update_actor`), BasePPOTrainer.broadcast_to_vllm
  (`update_weights`). The step's tokens are its experiences' total lengths (prompt and answer).

Standard library and the package's base at load time: Ray and OpenRLHF load inside the functions.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from verl_recipes.peers import marks
from verl_recipes.peers.openrlhf import MODULE
from verl_recipes.peers.spec import prepare
from verl_recipes.worker.import_hooks import after_import

#: the names OpenRLHF 0.11.2 imports from flash-attn, by module
FLASH_ATTN_NAMES = {
    "flash_attn.bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
    "flash_attn.utils.distributed": ("all_gather",),
}
_STEPS: list[marks.Steps] = []


def _absent(module: str, name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{module}.{name} was called: flash-attn is not installed (no wheel on PyPI), so OpenRLHF's "
            "packed-sample and ring-attention paths cannot run; leave --ds.packing_samples, "
            "--train.dynamic_batch_enable and --ds.ring_attn_size off"
        )

    call.__name__ = name
    return call


def stand_in_flash_attn() -> None:
    """The flash_attn modules OpenRLHF imports, with functions that raise (module docstring)."""
    if "flash_attn" in sys.modules:
        return
    for name in ("flash_attn", "flash_attn.utils", *FLASH_ATTN_NAMES):
        mod = types.ModuleType(name)
        is_pkg = name in ("flash_attn", "flash_attn.utils")
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=is_pkg)
        if is_pkg:
            mod.__path__ = []
        for attr in FLASH_ATTN_NAMES.get(name, ()):
            setattr(mod, attr, _absent(name, attr))
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


def _steps() -> marks.Steps:
    if not _STEPS:
        _STEPS.append(marks.Steps(gpus=int(os.environ.get("VERL_RECIPES_PEER_GPUS", "1"))))
    return _STEPS[0]


def _mark_samples_generator(mod: types.ModuleType) -> None:
    """A step begins with a rollout that returns samples; the loop's last call, which finds the
    prompts exhausted and returns none, is no step and leaves no lines."""
    cls = mod.SamplesGenerator
    generate = marks.method(cls, "generate_samples")
    if getattr(generate, "_verl_recipes_phase", None):
        return

    def generate_and_mark(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        out = generate(self, *args, **kwargs)
        if out and out[0]:
            steps = _steps()
            steps.begin(t0)
            steps.record("gen", t0, time.time())
        return out

    generate_and_mark._verl_recipes_phase = "gen"  # type: ignore[attr-defined]
    cls.generate_samples = generate_and_mark


def _mark_trainer(mod: types.ModuleType) -> None:
    cls = mod.BasePPOTrainer
    step = marks.method(cls, "train_step")
    if getattr(step, "_verl_recipes_phase", None):
        return
    marks.wrap_method(cls, "ppo_train", "update_actor", _steps())
    marks.wrap_method(cls, "broadcast_to_vllm", "update_weights", _steps())

    def step_and_mark(self: Any, rollout_samples: Any, *args: Any, **kwargs: Any) -> Any:
        steps = _steps()
        steps.add_tokens(sum(int(e.total_length.sum().item()) for e in rollout_samples))
        ok = False
        try:
            out = step(self, rollout_samples, *args, **kwargs)
            ok = True
            return out
        finally:
            steps.end(ok=ok)

    step_and_mark._verl_recipes_phase = "step"  # type: ignore[attr-defined]
    cls.train_step = step_and_mark


def _mark_experience_maker(mod: types.ModuleType) -> None:
    marks.wrap_method(mod.RemoteExperienceMaker, "make_experience_batch", "score", _steps())


def torch_adam_config(config: dict[str, Any]) -> dict[str, Any]:
    """A DeepSpeed training config with torch's AdamW asked for, where no CUDA toolkit can build
    DeepSpeed's own Adam (module docstring); unchanged where one can."""
    from torch.utils.cpp_extension import CUDA_HOME

    optimizer = config.get("optimizer")
    if CUDA_HOME is not None or not isinstance(optimizer, dict) or optimizer.get("type") != "AdamW":
        return config
    optimizer.setdefault("params", {})["torch_adam"] = True
    config["zero_force_ds_cpu_optimizer"] = False
    return config


def _torch_adam_without_nvcc(mod: types.ModuleType) -> None:
    cls = mod.DeepspeedStrategy
    get = marks.method(cls, "get_ds_train_config")
    if getattr(get, "_verl_recipes_torch_adam", False):
        return

    def get_with_torch_adam(self: Any, *args: Any, **kwargs: Any) -> Any:
        return torch_adam_config(get(self, *args, **kwargs))

    get_with_torch_adam._verl_recipes_torch_adam = True  # type: ignore[attr-defined]
    cls.get_ds_train_config = get_with_torch_adam


def install() -> None:
    """The stand-ins and the marks, in this process, for the modules it imports from now on."""
    stand_in_flash_attn()
    after_import("openrlhf.utils.deepspeed.deepspeed", _torch_adam_without_nvcc)
    after_import("openrlhf.trainer.ppo_utils.samples_generator", _mark_samples_generator)
    after_import("openrlhf.trainer.ppo_utils.experience_maker", _mark_experience_maker)
    after_import("openrlhf.trainer.ppo_trainer", _mark_trainer)


def worker_setup() -> None:
    """Ray's worker_process_setup_hook: what `install` does, in every worker of the run."""
    install()


def start_ray() -> None:
    """Ray as OpenRLHF's `train` starts it (openrlhf/cli/train_ppo_ray.py), with the setup hook."""
    import ray

    env = {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    ray.init(runtime_env={"env_vars": env, "worker_process_setup_hook": f"{__name__}.worker_setup"})


def main(argv: list[str] | None = None) -> int:
    spec = prepare(argv, "verl_recipes.peers.run_openrlhf")
    if spec is None:
        return 2
    os.environ["VERL_RECIPES_PEER_GPUS"] = str(spec.gpus)
    install()
    start_ray()
    sys.argv = [f"{MODULE.replace('.', '/')}.py", *spec.argv]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
