"""Compose a recipe against verl's own Hydra configuration, strictly.

A recipe's `config.yaml` holds only deltas from verl 0.9.1's defaults (`ppo_trainer` or
`ppo_megatron_trainer`). We compose verl's root config with Hydra exactly as
`python -m verl.trainer.main_ppo` would, then merge the deltas with OmegaConf's struct flag
on, so a key that verl does not define fails instead of being silently added; the error names
the key and the closest valid one. Empty mappings in verl's config (``engine_kwargs.vllm: {}``,
``override_config: {}``) are free-form by design and accept new keys. Each value is checked
against the type and range verl's schema gives its key as its layer is merged
(`verl_recipes.recipe.verl_schema`), so ``--set data.train_batch_size=abc`` fails here, in one line.

The composed config is saved unresolved (interpolations kept) and verl is started on it with
``--config-path RUN_DIR --config-name verl_config``, so the job runs exactly what `show` prints.
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.recipe.provider_fields import PROVIDER_FIELDS, read_provider_fields
from verl_recipes.recipe.verl_renames import gone, moved_prefix
from verl_recipes.recipe.verl_schema import check_layer


def verl_config_dir() -> Path:
    """verl's packaged Hydra config folder (verl/trainer/config)."""
    try:
        import verl
    except ImportError as e:
        raise RecipeError("verl is not installed: pip install 'verl-recipes[verl]' (verl==0.9.1)") from e
    return Path(verl.__file__).parent / "trainer" / "config"


_VERL: dict[tuple[str, tuple[tuple[str, int, int], ...]], tuple[Any, Any]] = {}


def _composed(config_name: str) -> tuple[Any, Any]:
    """verl's root config as Hydra composed it, and a copy of it made ready to merge into
    (`merge_strict`'s struct flags set); both shared within the process: callers never change them.

    Composed once per process while no file of verl's config folder changes (the key is the
    config's name and every file's path, modification time and size). Hydra reads and merges some
    30 YAML files for each composition, about a second, and `docs`, `plan` and a campaign compose a
    recipe many times over."""

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = verl_config_dir()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    key = (config_name, tuple((str(p), (st := p.stat()).st_mtime_ns, st.st_size) for p in files))
    if key not in _VERL:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            cfg = compose(config_name=config_name)
        _VERL[key] = (cfg, _ready_to_merge(copy.deepcopy(cfg)))
    return _VERL[key]


def compose_verl(config_name: str) -> Any:
    """verl's own root config as Hydra composes it, with no overrides: each caller's own copy."""

    return copy.deepcopy(_composed(config_name)[0])


#: Mappings verl hands whole to another library, so their keys are that library's, not verl's:
#: the fields of Megatron-Bridge's GPT provider (verl fills in a few recompute and attention
#: defaults), checked against the pinned provider's committed fields (check_passed_through).
PASSED_THROUGH = frozenset({"override_transformer_config"})


def _open_empty_nodes(node: Any) -> None:
    """Let empty mappings take new keys (verl leaves them empty for free-form kwargs), and the
    mappings verl passes through to another library (PASSED_THROUGH)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        if len(node) == 0:
            OmegaConf.set_struct(node, False)
            return
        for key in node:
            child = node._get_node(key)
            if str(key) in PASSED_THROUGH and isinstance(child, DictConfig):
                OmegaConf.set_struct(child, False)
                continue
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                _open_empty_nodes(child)


def _all_keys(node: Any, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig

    out: list[str] = []
    if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
        for key in node:
            full = f"{prefix}.{key!s}" if prefix else str(key)
            out.append(full)
            out.extend(_all_keys(node._get_node(key), full))
    return out


def _suggest(base: Any, full_key: str) -> str:
    """The closest valid key to a bad one: siblings first, then anywhere in the config."""
    from omegaconf import DictConfig, OmegaConf

    parent_key, _, leaf = full_key.rpartition(".")
    parent = OmegaConf.select(base, parent_key) if parent_key else base
    if isinstance(parent, DictConfig):
        close = difflib.get_close_matches(leaf, [str(k) for k in parent], n=1, cutoff=0.5)
        if close:
            return f"{parent_key}.{close[0]}" if parent_key else close[0]
    leaves = _all_keys(base)
    close = difflib.get_close_matches(full_key, leaves, n=1, cutoff=0.6)
    if close:
        return close[0]
    by_leaf = [k for k in leaves if k.rsplit(".", 1)[-1] == leaf]
    return by_leaf[0] if by_leaf else ""


def _moved_hint(base: Any, delta: Any, full_key: str) -> tuple[str, str]:
    """The key to name and the closest valid one. In a section verl moved since the commit verl's
    examples are read at (`recipe.verl_renames`), a key neither schema has is named whole and
    looked for under the section's new name: `critic.model.fsdp_config.param_ofload` ->
    `critic.fsdp.param_offload`."""
    if moved_prefix(full_key) is None:
        return full_key, _suggest(base, full_key)
    under = [k for k in _all_keys(delta) if k.startswith(full_key + ".")]
    key = next((k for k in under if not any(u.startswith(k + ".") for u in under)), full_key)
    moved = moved_prefix(key) or key
    parent, _, leaf = moved.rpartition(".")
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.select(base, parent) if parent else base
    if isinstance(node, DictConfig) and leaf in node:
        return key, moved
    return key, _suggest(base, moved)


def _ready_to_merge(base: Any) -> Any:
    """`base` in struct mode (a key verl does not define fails), its free-form mappings open."""
    from omegaconf import OmegaConf

    OmegaConf.set_struct(base, True)
    _open_empty_nodes(base)
    return base


def merge_strict(base: Any, delta: Any, source: str, lines: dict[str, str] | None = None) -> Any:
    """Merge `delta` into `base`; an unknown key raises RecipeError naming it and a suggestion.

    `lines` maps a key to the `--set` line it came from when that line had Hydra's `+` or `++`:
    the answer then names the line as given and the suggestion in the form that works (`++key`
    stays `++key`; `+key` on a key verl has is refused, so the suggestion drops the `+`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    _ready_to_merge(base)
    try:
        merged = OmegaConf.merge(base, delta)  # a new config: `base` itself is left as it was
    except (ConfigKeyError, ConfigAttributeError) as e:
        full_key = str(getattr(e, "full_key", None) or getattr(e, "key", "?"))
        full_key, hint = _moved_hint(base, delta, full_key)
        line = (lines or {}).get(full_key)
        if line is not None:
            form = "++" if line.startswith("++") else ""
            value = line.partition("=")[2]
            did = f"; did you mean --set {form}{hint}={value}?" if hint else ""
            plus = (
                " (Hydra's + adds a key only to a free-form mapping; the key meant is there already)"
                if hint and not form
                else ""
            )
            raise RecipeError(f"{source} {line}: unknown verl config key '{full_key}'{did}{plus}") from None
        did = f"; did you mean '{hint}'?" if hint else ""
        old = gone(full_key) if not hint else None
        if old:
            did = f": verl's schema had it at commit {old[:9]}, verl 0.9.1's has no such key; drop it"
        raise RecipeError(f"{source}: unknown verl config key '{full_key}'{did}") from None
    except OmegaConfBaseException as e:  # e.g. a list where verl has a section
        where = getattr(e, "full_key", "") or "(top)"
        raise RecipeError(f"{source}: {where}: {str(e).splitlines()[0]}") from None
    check_layer(base, merged, delta, source)
    check_passed_through(delta, source)
    return merged


def check_passed_through(delta: Any, source: str) -> None:
    """A key under `override_transformer_config` must be a field of Megatron-Bridge's GPT provider.

    verl 0.9.1 sets each one on the provider inside the training worker, after Ray, the workers and
    the checkpoint load have started; a typo would surface there as an AttributeError. The pinned
    provider's fields are committed (verl_recipes.recipe.provider_fields), so the check
    runs here, on any machine, before anything starts."""

    found = [k.rsplit(".", 1) for k in _all_keys(delta) if k.count(".") and k.split(".")[-2] in PASSED_THROUGH]
    if not found:
        return
    fields = read_provider_fields(repo_root())
    if not fields:
        return
    for where, key in found:
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=1, cutoff=0.6)
            did = f"; did you mean '{close[0]}'?" if close else ""
            raise RecipeError(
                f"{source}: '{where}.{key}' is not a field of Megatron-Bridge's GPT provider ({PROVIDER_FIELDS}){did}"
            )


def load_delta(path: Path) -> Any:
    from omegaconf import OmegaConf

    try:
        delta = load_config(path)
    except Exception as e:  # yaml errors come in several types
        raise RecipeError(f"{path}: not valid YAML: {e}") from None
    return delta if delta is not None else OmegaConf.create({})


@functools.cache
def _fast_loader() -> Any:
    """OmegaConf's YAML loader (its float and duplicate-key rules, no timestamps) on libyaml's
    parser, where PyYAML was built with it; else OmegaConf's own."""
    from omegaconf._utils import get_yaml_loader

    slow = get_yaml_loader()
    try:
        from yaml.cyaml import CParser  # type: ignore[attr-defined]
    except ImportError:
        return slow

    class Loader(CParser, slow):  # type: ignore[misc,valid-type]
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    return Loader


def load_config(path: Path) -> Any:
    """`OmegaConf.load(path)`, the same config, parsed in C: a saved verl config is 1,000 lines, and
    the pure-Python parser takes most of the time `docs` and `plan` spend reading committed runs.
    A file that does not parse is read again by OmegaConf itself, for its own error message."""
    from omegaconf import OmegaConf

    try:
        obj = yaml.load(path.read_text(encoding="utf-8"), Loader=_fast_loader())
    except yaml.YAMLError:
        return OmegaConf.load(path)
    if obj is not None and not isinstance(obj, (list, dict, str)):
        return OmegaConf.load(path)  # OmegaConf's own error for a scalar document
    return OmegaConf.create() if obj is None else OmegaConf.create(obj)


_SAVED: dict[tuple[str, int, int], Any] = {}


def saved_config(path: Path) -> Any:
    """A run's saved verl_config.yaml, read once per process while the file is unchanged (the key
    is its path, modification time and size): `plan` reads every committed run of the recipe for
    its verdict and again for its cost line, `docs` for each results row and its drift. Read-only,
    since every reader shares it."""
    from omegaconf import OmegaConf

    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _SAVED:
        cfg = load_config(path)
        OmegaConf.set_readonly(cfg, True)
        _SAVED[key] = cfg
    return _SAVED[key]


def parse_sets(sets: Iterable[str]) -> Any:
    """`key=value` strings (like Hydra's command line) as one OmegaConf delta."""
    from omegaconf import OmegaConf

    items = list(sets)
    for s in items:
        if "=" not in s:
            raise RecipeError(f"--set {s!r}: expected key=value, e.g. data.train_batch_size=16")
    return OmegaConf.from_dotlist(items)


def hydra_prefixes(base: Any, sets: Iterable[str]) -> list[str]:
    """`--set` lines with Hydra's override prefixes answered in terms of the key meant.

    `++key=value` (set or add) is `key=value` here, judged as strictly as any other key. `+key=value`
    adds a key: on a key verl already has, Hydra refuses it, and so does this, saying to drop the +;
    on a new key it is `key=value`, which only a free-form mapping takes. `~key` deletes a key: verl's
    schema keeps every key it defines, so it is refused with the value to set instead.
    """
    from omegaconf import OmegaConf

    def exists(key: str) -> bool:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        return OmegaConf.is_dict(node) and leaf in node

    out = []
    for line in sets:
        key, _, value = line.partition("=")
        if line.startswith("~"):
            key = key[1:]
            if not exists(key):
                hint = _suggest(base, key)
                did = f"; did you mean '{hint}'?" if hint else ""
                raise RecipeError(f"--set {line}: Hydra's ~ deletes a key, and verl's config has no '{key}'{did}")
            raise RecipeError(
                f"--set {line}: Hydra's ~ deletes '{key}', but verl reads every key of its schema: "
                f"set a value instead, e.g. --set {key}=null"
            )
        if line.startswith("++"):
            out.append(line[2:])
        elif line.startswith("+"):
            if exists(key[1:]):
                raise RecipeError(
                    f"--set {line}: '{key[1:]}' is already in verl's config, and Hydra's + only adds a new key: "
                    f"drop the +, --set {key[1:]}={value}"
                )
            out.append(line[1:])
        else:
            out.append(line)
    return out


def _merge_sets(cfg: Any, overrides: Sequence[str]) -> Any:
    plus = {line.lstrip("+").partition("=")[0]: line for line in overrides if line.startswith("+")}
    return merge_strict(cfg, parse_sets(hydra_prefixes(cfg, overrides)), "--set", plus)


def compose_recipe(
    recipe: Recipe,
    variant: str | Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    extra: Any | None = None,
) -> Any:
    """The full verl config for a recipe: verl defaults + config.yaml + variant + extra + --set."""

    # verl's config as composed once, shared: every merge below makes a new config, never changes it
    verl = _composed(recipe.verl_config_name)[1]
    cfg = verl
    for path in recipe.config_files(variant):
        cfg = merge_strict(cfg, load_delta(path), str(path))
    if extra is not None:
        cfg = merge_strict(cfg, extra, "launcher settings")
    if overrides:
        cfg = _merge_sets(cfg, overrides)
    return copy.deepcopy(cfg) if cfg is verl else cfg


def compose_file(path: Path, config_name: str = "ppo_trainer", overrides: Sequence[str] = ()) -> Any:
    """Compose a stand-alone deltas file (a user's copy of a recipe config)."""
    cfg = merge_strict(compose_verl(config_name), load_delta(path), str(path))
    if overrides:
        cfg = _merge_sets(cfg, overrides)
    return cfg
