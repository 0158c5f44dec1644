"""Each composed value against verl's schema: the type verl declares for the key, and its range.

verl 0.9.1's Hydra tree is plain YAML, so OmegaConf takes any value for a key that exists: a
`data.train_batch_size=abc` composed silently and surfaced later as a traceback in the planner or
in verl's workers on the GPU host. `compose.merge_strict` therefore checks every value a layer
sets (a recipe's config.yaml, a variant, the launcher's settings, `--set`) as the layer is merged,
and the one-line error names the layer and the key:

* the type: the annotation of the field in verl's config dataclass (the `_target_` of the node
  that holds the key, e.g. `verl.workers.config.FSDPActorConfig`), else the type of verl's
  default value. Whole numbers stay whole numbers, numbers numbers, booleans true/false, a
  `Literal` one of its choices; null only where verl's default or annotation allows it; a value
  never replaces a section, nor a section a value;
* the range: the sizes and counts verl divides by are at least 1, and a GPU memory fraction lies
  in (0, 1]. verl's own start-up checks (`verl.utils.config.validate_config`) run in `train`'s
  pre-flight, where the GPU layout is known.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
import typing
from collections.abc import Iterator
from typing import Any

from verl_recipes import RecipeError

# Leaf names whose values verl divides by or counts with: at least 1 when set.
AT_LEAST_ONE = frozenset(
    {
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "data_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "ulysses_sequence_parallel_size",
        "train_batch_size",
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "log_prob_micro_batch_size_per_gpu",
        "forward_micro_batch_size_per_gpu",
        "ppo_max_token_len_per_gpu",
        "log_prob_max_token_len_per_gpu",
        "forward_max_token_len_per_gpu",
        "ppo_epochs",
        "max_prompt_length",
        "max_response_length",
        "max_num_seqs",
        "max_num_batched_tokens",
        "n_gpus_per_node",
        "nnodes",
    }
)
# Full keys with a generic leaf name.
AT_LEAST_ONE_KEYS = frozenset({"actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.val_kwargs.n"})
FRACTIONS = frozenset({"gpu_memory_utilization"})

_MISSING = object()


def check_layer(before: Any, after: Any, delta: Any, source: str) -> None:
    """Every value `delta` sets, against verl's type and range for its key; `before` is the config
    the layer was merged into and `after` the result (whose `_target_`s name the dataclasses)."""
    for key, value, is_section in _leaves(delta):
        old = _raw(before, key)
        if is_section:
            if old is not _MISSING and old is not None and not _is_section(before, key):
                raise RecipeError(f"{source}: {key} is a value in verl's config ({old!r}), not a section")
            continue
        if old is not _MISSING and _is_section(before, key) and value is not None:
            raise RecipeError(f"{source}: {key} is a section of verl's config; set the keys inside it instead")
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: checked where it points
        want = _problem(value, _annotation(after, key), old)
        if want:
            raise RecipeError(f"{source}: {key}={_show(value)}: verl's schema wants {want}")
        problem = _range(key, value)
        if problem:
            raise RecipeError(f"{source}: {key}={_show(value)}: {problem}")


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any, bool]]:
    """(dotted key, raw value, is a section) for what a delta sets, interpolations unresolved."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    for key in node:
        full = f"{prefix}.{key}" if prefix else str(key)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            yield full, None, True
            if not child._is_missing():
                yield from _leaves(child, full)
        elif isinstance(child, ListConfig) and not child._is_none():
            yield full, OmegaConf.to_container(child, resolve=False), False
        elif not OmegaConf.is_missing(node, key):
            yield full, child._value(), False


def _walk(cfg: Any, key: str) -> Any:
    """The node at a dotted key without resolving anything, or _MISSING."""
    from omegaconf import DictConfig

    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing() or part not in node:
            return _MISSING
        node = node._get_node(part)
    return node


def _is_section(cfg: Any, key: str) -> bool:
    from omegaconf import DictConfig

    node = _walk(cfg, key)
    return isinstance(node, DictConfig) and not node._is_none()


def _raw(cfg: Any, key: str) -> Any:
    """verl's value for `key` before the layer: resolved where it is an interpolation that
    resolves, the raw node value otherwise; _MISSING when the key is new (free-form nodes)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    node = _walk(cfg, key)
    if node is _MISSING:
        return _MISSING
    if isinstance(node, DictConfig | ListConfig):
        return None if node._is_none() else OmegaConf.to_container(node, resolve=False)
    value = node._value()
    if isinstance(value, str) and "${" in value:
        try:
            return OmegaConf.select(cfg, key)
        except Exception:  # an interpolation that needs a later layer
            return _MISSING
    return None if value == "???" else value


@functools.cache
def _hints(target: str) -> dict[str, Any]:
    """Field annotations of a verl config dataclass named by a `_target_`; empty when unknown."""
    if not target.startswith("verl."):
        return {}
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        if not dataclasses.is_dataclass(cls):
            return {}
        return typing.get_type_hints(cls)
    except Exception:  # an optional dependency of that module, or a forward reference
        return {}


def _annotation(cfg: Any, key: str) -> Any:
    from omegaconf import DictConfig

    parent_key, _, leaf = key.rpartition(".")
    parent = _walk(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or "_target_" not in parent:
        return None
    node = parent._get_node("_target_")
    target = node._value() if node is not None else None
    return _hints(target).get(leaf) if isinstance(target, str) else None


def _problem(value: Any, annotation: Any, default: Any) -> str | None:
    """What the key wants when `value` does not fit, else None."""
    if annotation is not None:
        return wants(value, annotation)
    if default is _MISSING or default is None:
        return None  # a free-form or unset key: verl declares no type for it
    if isinstance(default, bool | int | float):
        return wants(value, type(default))
    return None


def wants(value: Any, tp: Any) -> str | None:
    """What a key of type `tp` wants when `value` is not of it ("a whole number"), else None."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return None
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        each = [wants(value, a) for a in args if a is not type(None)]
        if any(w is None for w in each):
            return None
        return " or ".join(dict.fromkeys(w for w in each if w))
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        return None if value in choices else "one of " + ", ".join(str(c) for c in choices)
    if value is None:
        return f"{_kind(tp)}, not null"
    if tp is bool:
        return None if isinstance(value, bool) else "true or false"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    if tp is float:
        return None if isinstance(value, int | float) and not isinstance(value, bool) else "a number"
    if tp is str:
        return None if not isinstance(value, list | dict) else "a string"
    if tp in (list, tuple) or origin in (list, tuple):
        return None if isinstance(value, list) else "a list"
    return None  # a type this check does not model (enums, nested configs): verl's own checks see it


def _kind(tp: Any) -> str:
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}.get(tp, "a value")


def _range(key: str, value: Any) -> str | None:
    leaf = key.rpartition(".")[2]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and (leaf in AT_LEAST_ONE or key in AT_LEAST_ONE_KEYS) and value < 1:
        return "must be at least 1 (verl divides by it)"
    if number and leaf in FRACTIONS and not 0 < value <= 1:
        return "must be a fraction of the GPU's memory in (0, 1]"
    return None
