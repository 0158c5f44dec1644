"""A verl job as its users write it (`verl_recipes.recipe.verl_command`), as the project runs it.

A script names what cannot exist here: a Hub model id, the user's parquet files, a reward model or
function of theirs, wandb. Each is mapped and said, never changed silently (`VerlJob.mapped`):

* `actor_rollout_ref.model.path` (and the critic's): the bundled architecture of that id
  (`workload.arch.arch_for_model_id`, or `--arch`), trained from a synthetic checkpoint of it;
* `data.train_files` / `data.val_files`: the embedded arithmetic dataset, at the script's own
  `data.max_prompt_length` and `data.max_response_length` (those keys are kept);
* the reward (`reward_model.*`, `reward.*`, `custom_reward_function.*`): the embedded rule
  reward; a reward *model* the script starts is said to be left out of the plan;
* `trainer.logger`: console, the run's metrics file and a TensorBoard event file in the run folder;
* `trainer.nnodes` x `trainer.n_gpus_per_node`: the layout `plan` judges and `train --rank R`
  rehearses; `trainer.total_epochs` / `total_training_steps`: `train --steps`;
  `trainer.default_local_dir`: the run folder.

Every other override is kept, in the script's order, as a `--set` line composed against verl's
schema exactly as the recipes' are (`run_config.compose_run`), so `plan` and `train` judge and run
one configuration. A job verl's examples name that this project cannot run (another rollout engine,
an Ascend NPU, a saved adapter to start from) is one line saying so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.recipe.metadata import GPUSpec, ModelSpec, Recipe, SmokeSpec
from verl_recipes.recipe.run_config import Layout
from verl_recipes.recipe.verl_command import Override, VerlCommand, canonical
from verl_recipes.recipe.verl_renames import renamed
from verl_recipes.workload.arch import arch_for_model_id, bundled_archs, resolve_arch

#: the GPU a verl example is written for (8 x 80 GB, A100 or H100): a rehearsal's default budget
EXAMPLE_GPU_GIB = 80.0

_MODEL = "actor_rollout_ref.model.path"
_DATA = ("data.train_files", "data.val_files")
_LAYOUT = ("trainer.n_gpus_per_node", "trainer.nnodes")
_STEPS = ("trainer.total_epochs", "trainer.total_training_steps")
#: keys the launcher owns (`run_config.launcher_settings`); the job's value is mapped, not kept
_LAUNCHER = {
    _MODEL,
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "critic.model.tokenizer_path",
    *_DATA,
    *_LAYOUT,
    *_STEPS,
    "trainer.logger",
    "trainer.default_local_dir",
}
#: reward keys that size a CPU worker pool (host RAM): kept, the planner reads them
_REWARD_POOLS = ("reward.num_workers", "reward_model.num_workers")
#: what the project's loggers are (the launcher's console and metrics file, and TensorBoard's)
LOGGERS = ["console", "file", "tensorboard"]


class VerlJobRecipe(Recipe):
    """A recipe with no deltas of its own: the job's overrides are its `--set` lines."""

    def config_files(self, variants: str | Sequence[str] | None = None) -> list[Path]:
        if variants:
            raise RecipeError("--variant applies to recipes; a verl job takes --set KEY=VALUE")
        return []


@dataclass(frozen=True)
class VerlJob:
    """A verl job mapped onto this project: a deltas-free recipe, its `--set` lines and layout."""

    name: str  # the script's file name, a suite entry's name, or "command-line"
    source: str  # where it was read: a script path, "the command line", a suite entry
    recipe: VerlJobRecipe
    sets: tuple[str, ...]  # the job's kept overrides, then the user's own --set lines
    layout: Layout
    arch: str
    mapped: tuple[str, ...]  # "key=value -> what stands in for it"
    keys: tuple[str, ...]  # every key the job sets (the planner says which it does not model)
    dropped: tuple[str, ...]  # the keys mapped above, not kept as --set lines
    skipped: tuple[str, ...] = ()  # lines of the script that only prepare its host


def _value(o: Override) -> Any:
    return json.loads(o.text.split("=", 1)[1]) if "=" in o.text else None


def _int(o: Override | None, default: int) -> int:
    if o is None:
        return default
    v = _value(o)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RecipeError(f"{o.key}={v!r}: must be a positive integer")
    return v


def _params(arch: str) -> int:
    """The parameter count of a bundled architecture's config.json (dense decoder), for the disk
    check of a run (`stack.verify`); the planner counts its own (`predict.model.Arch`)."""
    c = resolve_arch(arch)
    h, inter, layers, vocab = (
        int(c[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    per_layer = h * hd * (heads + 2 * kv) + heads * hd * h + 3 * h * inter + 2 * h
    return vocab * h * (1 if c.get("tie_word_embeddings") else 2) + layers * per_layer + h


def _refuse_unrunnable(keys: dict[str, Override], source: str) -> None:
    """Jobs verl's examples name that this project does not run, each in one line."""
    name = keys.get("actor_rollout_ref.rollout.name")
    if name is not None and _value(name) not in ("vllm", None):
        raise RecipeError(
            f"{source}: line {name.line}: rollout {_value(name)}: this project runs vLLM's rollout; "
            "pass --set actor_rollout_ref.rollout.name=vllm to plan the job on vLLM"
        )
    device = keys.get("trainer.device")
    if device is not None and _value(device) not in ("cuda", None):
        raise RecipeError(f"{source}: line {device.line}: trainer.device={_value(device)}: an NVIDIA GPU job only")
    adapter = keys.get("actor_rollout_ref.model.lora_adapter_path")
    if adapter is not None and _value(adapter) is not None:
        raise RecipeError(
            f"{source}: line {adapter.line}: starts from a saved LoRA adapter ({_value(adapter)}), which does not "
            "exist here; drop it and set actor_rollout_ref.model.lora_rank to its rank"
        )


def verl_job(
    cmd: VerlCommand,
    name: str,
    sets: Sequence[str] = (),
    arch: str | None = None,
) -> VerlJob:
    """The project's job for a verl trainer call; `sets` are the user's own `--set` lines (after
    the job's), `arch` stands in for the script's model id."""
    source = cmd.source
    if cmd.config_name not in (None, "ppo_trainer", "ppo_megatron_trainer"):
        raise RecipeError(
            f"{source}: --config-name {cmd.config_name}: verl's ppo_trainer and ppo_megatron_trainer are read"
        )
    cmd, moved = _renamed(cmd)
    keys = cmd.keys()
    # the user's own --set lines come after the job's: what they set is the job's too
    user = {o.key: o for o in (_set_override(x) for x in sets)}
    _refuse_unrunnable({**keys, **user}, source)
    if arch is not None and arch not in bundled_archs():
        raise RecipeError(f"--arch {arch}: a verl job takes a bundled architecture ({', '.join(bundled_archs())})")
    mapped: list[str] = []
    model = keys.get(_MODEL)
    if arch is None:
        if model is None:
            raise RecipeError(f"{source}: sets no {_MODEL}; pass --arch NAME|config.json")
        try:
            arch = arch_for_model_id(str(_value(model)))
        except RecipeError as e:
            raise RecipeError(f"{source}: line {model.line}: {e}") from None
        mapped.append(f"{_MODEL}={_value(model)} -> bundled architecture {arch} (synthetic weights)")
    elif model is not None:
        mapped.append(f"{_MODEL}={_value(model)} -> --arch {arch} (synthetic weights)")
    critic = keys.get("critic.model.path")
    if critic is not None:
        same = model is not None and _value(critic) == _value(model)
        to = "the actor's synthetic checkpoint" if same else f"the actor's architecture {arch} (the planner's critic)"
        mapped.append(f"critic.model.path={_value(critic)} -> {to}")
    mapped += moved
    for key in _DATA:
        if key in keys:
            mapped.append(
                f"{key}={_short(_value(keys[key]))} -> the embedded arithmetic dataset, at the job's "
                "data.max_prompt_length and data.max_response_length"
            )
    reward = [k for k in keys if _is_reward(k)]
    if reward:
        rm = _value(keys["reward_model.enable"]) if "reward_model.enable" in keys else False
        what = (
            f"a reward model ({_value(keys['reward_model.model.path'])})"
            if rm and "reward_model.model.path" in keys
            else ""
        )
        mapped.append(
            f"{', '.join(reward[:3])}{' ...' if len(reward) > 3 else ''} -> the embedded rule reward"
            + (f"; {what} is not started, and its GPU memory is not in the plan" if what else "")
        )
    if "trainer.logger" in keys:
        mapped.append(
            f"trainer.logger={json.dumps(_value(keys['trainer.logger']))} -> {json.dumps(LOGGERS)} "
            "(TensorBoard in the run folder)"
        )
    nodes = user.get("trainer.nnodes") or keys.get("trainer.nnodes")
    per_node = user.get("trainer.n_gpus_per_node") or keys.get("trainer.n_gpus_per_node")
    layout = Layout(_int(per_node, 8), _int(nodes, 1))
    mapped.append(
        f"trainer.nnodes={layout.nnodes} x trainer.n_gpus_per_node={layout.per_node} -> the layout planned and "
        f"rehearsed ({layout.world} GPU(s){'' if per_node else ', verl default'})"
    )
    for key in _STEPS:
        if key in keys:
            mapped.append(f"{key}={_value(keys[key])} -> train --steps")
    if "data.prompt_key" in keys and _value(keys["data.prompt_key"]) != "prompt":
        mapped.append(f"data.prompt_key={_value(keys['data.prompt_key'])} -> prompt (the embedded dataset's)")
    save = keys.get("trainer.save_freq")
    no_save = save is not None and isinstance(_value(save), int) and _value(save) > 0
    if no_save:
        assert save is not None
        # verl saves at the last step too (RayPPOTrainer.fit: `is_last_step or ...`), and train
        # --steps N makes step N the last: a save the job makes only every save_freq steps
        mapped.append(
            f"trainer.save_freq={_value(save)} -> -1 (no checkpoint: verl also saves at the last step, "
            "which train --steps moves)"
        )
    dropped = [
        k
        for k in keys
        if k in _LAUNCHER
        or (_is_reward(k) and k not in _REWARD_POOLS)
        or k == "data.prompt_key"
        or (k == "trainer.save_freq" and no_save)
    ]
    kept = [o.text for o in cmd.overrides if o.key not in dropped]
    kept.append(f"trainer.logger={json.dumps(LOGGERS)}")
    if "trainer.save_freq" in dropped:
        kept.append("trainer.save_freq=-1")
    adv = _value(keys["algorithm.adv_estimator"]) if "algorithm.adv_estimator" in keys else "gae"
    enable = _value(keys["critic.enable"]) if "critic.enable" in keys else None
    for model_key, used in ((_M_KEY, True), ("critic.model", bool(enable) if enable is not None else adv == "gae")):
        line = _attention(keys, model_key)
        if line is not None:
            kept.append(line[0])
            if used:
                mapped.append(line[1])
    backend = "megatron" if cmd.config_name == "ppo_megatron_trainer" else "fsdp"
    recipe = VerlJobRecipe(
        id=name,
        title=f"verl job {name}",
        summary=f"read from {source}",
        model=ModelSpec(arch=arch, params=_params(arch)),
        algorithm="ppo" if adv == "gae" else "grpo",
        backend=backend,
        gpus=GPUSpec(
            count=layout.world,
            nodes=layout.nnodes,
            per_gpu_gib=EXAMPLE_GPU_GIB,
            target=f"{layout.nnodes} node(s) of {layout.per_node} 80 GB GPUs, as verl's examples are written for",
        ),
        smoke=SmokeSpec(layers=2, scale="tiny", steps=1),
    )
    return VerlJob(
        name=name,
        source=source,
        recipe=recipe,
        sets=(*kept, *sets),
        layout=layout,
        arch=arch,
        mapped=tuple(mapped),
        keys=tuple(keys),
        dropped=tuple(dropped),
        skipped=cmd.skipped,
    )


def _renamed(cmd: VerlCommand) -> tuple[VerlCommand, list[str]]:
    """The command with each key verl moved since the commit verl's examples are read at under its
    verl 0.9.1 name (`recipe.verl_renames`), and a mapped line for each. The launcher's keys and the
    reward's are mapped by this module whatever their name; a Megatron job's schema is not the table's."""
    if cmd.config_name not in (None, "ppo_trainer"):
        return cmd, []
    out, said = [], []
    for o in cmd.overrides:
        new = None if o.key in _LAUNCHER or _is_reward(o.key) else renamed(o.key)
        if new is None:
            out.append(o)
            continue
        sign = o.text[: len(o.text) - len(o.text.lstrip("+~"))]
        out.append(Override(sign + new + o.text[len(sign) + len(o.key) :], new, o.line, o.raw))
        value = o.text.partition("=")[2]
        said.append(f"{o.key}={value} -> {new} (verl 0.9.1's name for the key; recipe/verl_renames.yaml)")
    return replace(cmd, overrides=tuple(out)), said


def _set_override(line: str) -> Override:
    """A user's --set line read as Hydra reads it (`verl_command.canonical`)."""

    text, key = canonical(line, f"--set {line}")
    return Override(text, key, 0, line)


_M_KEY = "actor_rollout_ref.model"
#: the attention kernel verl 0.9.1 asks transformers for when a job names none
#: (`HFModelConfig`: `override_config.get("attn_implementation", "flash_attention_2")`)
VERL_ATTENTION = "flash_attention_2"


def _attention(keys: dict[str, Override], model: str) -> tuple[str, str] | None:
    """The attention a job that names none runs here, as a --set line and its mapped line.

    verl's default, flash-attn's kernel, is not in this project's images (no PyPI wheel for the
    pinned torch). With padding removal (verl's default) the packed sequences need a kernel that
    keeps them apart: torch's own variable-length one (`torch_varlen`,
    `worker.packed_attention`), the same packed tokens; without it, sdpa over padded rows."""
    key = f"{model}.override_config.attn_implementation"
    if key in keys:
        return None
    rp = keys.get(f"{model}.use_remove_padding")
    packed = bool(_value(rp)) if rp is not None else True
    impl = "torch_varlen" if packed else "sdpa"
    why = "the packed sequences kept apart" if packed else "padded rows, as use_remove_padding=false asks"
    return (
        f"{key}={json.dumps(impl)}",
        f"{key} (unset: verl's {VERL_ATTENTION}, whose flash-attn is not installed here) -> {impl} ({why})",
    )


def _is_reward(key: str) -> bool:
    # reward_manager.*: the reward manager's section before verl moved it under reward.
    return key.startswith(("reward_model.", "reward.", "custom_reward_function.", "reward_manager."))


def _short(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:57] + "..."
