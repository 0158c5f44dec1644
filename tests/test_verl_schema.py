"""Values against the type and range of verl 0.9.1's schema, checked as each layer is composed
(`verl_recipes.recipe.verl_schema`, called by `compose.merge_strict`), against verl's real Hydra tree and
config dataclasses; and the planner, fed any value of a key it reads, answers or refuses in one
line, never with a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.predict import inputs
from verl_recipes.predict.inputs import setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.predict.phases import plan_gpu
from verl_recipes.recipe.compose import compose_file, compose_recipe
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.recipe.verl_schema import check_layer
from verl_recipes.workload.arch import ARCHS_DIR

R = "actor_rollout_ref.rollout"


@pytest.mark.parametrize(
    ("value", "wants"),
    [
        ("data.train_batch_size=abc", "data.train_batch_size=abc: verl's schema wants a whole number"),
        ("data.train_batch_size=1.5", "wants a whole number"),
        ("data.train_batch_size=null", "wants a whole number, not null"),
        ("data.train_batch_size=0", "data.train_batch_size=0: must be at least 1"),
        (f"{R}.tensor_model_parallel_size=-2", "must be at least 1"),
        (f"{R}.gpu_memory_utilization=1.5", "in (0, 1]"),
        (f"{R}.free_cache_engine=maybe", "wants true or false"),  # a dataclass field (RolloutConfig)
        ("actor_rollout_ref.actor.fsdp_config.reshard_after_forward=3", "wants true or false"),
        (f"{R}=5", f"{R} is a section of verl's config"),
        ("data.train_batch_size={a: 1}", "data.train_batch_size is a value in verl's config"),
        ("data=[1]", "--set"),
    ],
)
def test_a_value_verl_cannot_take_fails_at_compose_in_one_line(
    value: str, wants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "7b-lora", "--only", "data", "--set", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set: ") and wants in err and "\n" not in err, err


def test_values_verl_takes_compose() -> None:
    cfg = compose_recipe(
        get_recipe("7b-lora"),
        [],
        [
            "data.train_batch_size=16",
            f"{R}.gpu_memory_utilization=1",  # an int where verl's float default is
            f"{R}.max_model_len=2048",  # verl's default is null: any value
            "trainer.logger=[console]",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        ],
    )
    assert cfg.data.train_batch_size == 16 and cfg.actor_rollout_ref.rollout.max_model_len == 2048


def test_a_config_file_names_its_layer(tmp_path: Path) -> None:
    f = tmp_path / "my-config.yaml"
    f.write_text("data:\n  max_prompt_length: long\n")
    with pytest.raises(RecipeError, match=rf"^{f}: data.max_prompt_length=long: verl's schema wants a whole number"):
        compose_file(f)


def test_a_literal_field_takes_only_its_choices() -> None:
    base = OmegaConf.create(
        {"e": {"_target_": "verl.workers.config.TorchtitanEngineConfig", "reshard_after_forward": 1}}
    )
    delta = OmegaConf.create({"e": {"reshard_after_forward": "sometimes"}})
    with pytest.raises(RecipeError, match="one of default, always, never"):
        check_layer(base, OmegaConf.merge(base, delta), delta, "t")


# ---- the planner never raises on user input ---------------------------------------------------
BAD: list[Any] = ["abc", 0, -1, 1.5, True, None, [1], {"a": 1}]


def _keys_the_planner_reads(cfg: Any, arch: Arch, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key `setup_from_config` reads, observed by wrapping its one reader."""
    seen: list[str] = []
    real = inputs._sel

    def record(c: Any, key: str, *a: Any, **kw: Any) -> Any:
        seen.append(key)
        return real(c, key, *a, **kw)

    monkeypatch.setattr(inputs, "_sel", record)
    setup_from_config(cfg, arch)
    monkeypatch.setattr(inputs, "_sel", real)
    return list(dict.fromkeys(seen))


@pytest.mark.parametrize(("rid", "arch"), [("7b-lora", "llama-2-7b"), ("70b-3d", "llama-2-70b")])
def test_the_planner_answers_or_refuses_in_one_line(rid: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each key the planner reads, set to values of the wrong type or range, directly on a composed
    config (what a hand-edited verl_config.yaml could hold, past composition's checks)."""
    a = Arch.from_file(ARCHS_DIR / arch / "config.json")
    cfg = compose_recipe(get_recipe(rid))
    keys = _keys_the_planner_reads(cfg, a, monkeypatch)
    assert len(keys) > 30, keys
    # One config, each bad value set in place and the key put back after it: a deep copy of the
    # composed config per value was most of this test's time (8 values x ~60 keys). The config is
    # checked to be the composed one again after every key, so no value leaks into the next.
    pristine = OmegaConf.to_yaml(cfg)
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key in keys:
        for value in BAD:
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, force_add=True, merge=False)
            try:
                plan_gpu(setup_from_config(cfg, a), _h200())
            except RecipeError as e:
                assert "\n" not in str(e), (key, value, str(e))
            except Exception as e:  # the point: nothing but a RecipeError escapes
                pytest.fail(f"{key}={value!r}: the planner raised {type(e).__name__}: {e}")
            finally:
                _put_back(cfg, raw, key)
        assert OmegaConf.to_yaml(cfg) == pristine, f"{key}: the config was not put back"


def _put_back(cfg: Any, raw: Any, key: str) -> None:
    """Set `key` of `cfg` to its value in `raw` (the composed config, unresolved), or remove what
    setting it added where the composed config has no such key."""
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            parent = OmegaConf.select(cfg, ".".join(parts[:i])) if i else cfg
            with open_dict(cfg):
                del parent[part]
            return
        node = node[part]
    with open_dict(cfg):
        OmegaConf.update(cfg, key, copy.deepcopy(node), merge=False)


def _h200() -> Any:
    from verl_recipes.predict.gpus import parse_gpu

    return parse_gpu("h200-141g")
