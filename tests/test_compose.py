"""Composition against verl 0.9.1's real Hydra config (no mocks): every recipe composes, and a
misspelt key fails naming the key and the closest valid one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.recipe.compose import compose_file, compose_recipe
from verl_recipes.recipe.metadata import discover, get_recipe


@pytest.mark.parametrize("rid", sorted(discover()))
def test_every_recipe_and_variant_composes(rid: str) -> None:
    recipe = get_recipe(rid)
    for variants in [[], *([v] for v in recipe.variants)]:
        cfg = compose_recipe(recipe, variants)
        # Something only verl's schema has, plus the recipe's own deltas applied.
        assert "rollout" in cfg.actor_rollout_ref
        assert cfg.trainer.project_name == "verl-recipes"
        assert cfg.actor_rollout_ref.rollout.name == "vllm"
        OmegaConf.to_yaml(cfg)  # serialisable, interpolations intact


def test_recipe_values_reach_the_composed_config() -> None:
    cfg = compose_recipe(get_recipe("7b-lora"))
    assert cfg.actor_rollout_ref.model.lora_rank == 64
    assert cfg.data.train_batch_size == 8
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == 1024
    assert cfg.algorithm.adv_estimator == "gae"
    grpo = compose_recipe(get_recipe("7b-lora"), ["grpo"])
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.actor_rollout_ref.rollout.n == 4
    mega = compose_recipe(get_recipe("70b-3d"))
    tp = mega.actor_rollout_ref.actor.megatron.tensor_model_parallel_size
    pp = mega.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size
    assert (tp, pp) == (4, 2)


def test_misspelt_key_in_a_copied_config_fails_with_suggestion(root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "my-config.yaml"
    shutil.copy(root / "recipes" / "7b-lora" / "config.yaml", copy)
    text = copy.read_text().replace("gpu_memory_utilization: 0.3", "gpu_memory_utilisation: 0.3")
    copy.write_text(text)
    with pytest.raises(RecipeError) as e:
        compose_file(copy)
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.gpu_memory_utilisation" in msg
    assert "did you mean 'actor_rollout_ref.rollout.gpu_memory_utilization'" in msg
    assert "\n" not in msg


def test_megatron_transformer_keys_pass_through_and_verl_keys_stay_checked() -> None:
    """verl hands `override_transformer_config` whole to Megatron's TransformerConfig, so a field
    verl's defaults do not list (here the recipe's `gradient_accumulation_fusion: false`, which
    megatron-core needs without APEX) composes; a misspelt key beside it still fails."""
    cfg = compose_recipe(get_recipe("70b-3d"), ["tp1pp1"])
    for model in (cfg.actor_rollout_ref.actor, cfg.critic, cfg.actor_rollout_ref.ref):
        assert model.megatron.override_transformer_config.gradient_accumulation_fusion is False
        assert model.megatron.override_transformer_config.attention_backend == "fused"
    extra = ["actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion=false"]
    tweaked = compose_recipe(get_recipe("70b-3d"), ["tp1pp1"], extra)
    assert tweaked.actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion is False
    with pytest.raises(RecipeError, match=r"actor_rollout_ref\.actor\.megatron\.param_ofload"):
        compose_recipe(get_recipe("70b-3d"), ["tp1pp1"], ["actor_rollout_ref.actor.megatron.param_ofload=true"])


def test_a_transformer_key_that_megatron_bridge_lacks_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl sets every `override_transformer_config` key on Megatron-Bridge's GPT provider inside
    the training worker (AttributeError there, minutes in). The pinned provider's committed fields
    refuse a typo at composition, in one line with the field meant; a recipe file is checked the
    same way as --set."""
    bad = "critic.megatron.override_transformer_config.recompute_granularty=full"
    assert main(["show", "70b-3d", "--variant", "tp1pp1", "--set", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "critic.megatron.override_transformer_config.recompute_granularty" in err[0], err
    assert "'recompute_granularity'" in err[0] and "megatron-provider-fields.txt" in err[0], err
    copy = tmp_path / "70b-3d"
    shutil.copytree(get_recipe("70b-3d").dir, copy)
    text = (copy / "config.yaml").read_text()
    assert text.count("attention_backend: fused") == 2
    (copy / "config.yaml").write_text(text.replace("attention_backend: fused", "attention_backnd: fused", 1))
    want = r"config\.yaml: '.*override_transformer_config\.attention_backnd'.*'attention_backend'"
    with pytest.raises(RecipeError, match=want):
        compose_file(copy / "config.yaml", "ppo_megatron_trainer")


def test_set_overrides_are_checked_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "7b-lora", "--set", "trainer.totl_epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "trainer.totl_epochs" in err and "trainer.total_epochs" in err
    assert main(["show", "7b-lora", "--only", "data.train_batch_size", "--set", "data.train_batch_size=16"]) == 0
    assert capsys.readouterr().out.strip() == "16"


def test_free_form_mappings_accept_new_keys() -> None:
    cfg = compose_recipe(get_recipe("7b-lora"), overrides=["actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4


def test_show_prints_the_whole_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "13b-fsdp"]) == 0
    out = capsys.readouterr().out
    loaded = OmegaConf.create(out)
    assert loaded.trainer.experiment_name == "13b-fsdp"
    assert len(out.splitlines()) > 500


def test_one_gpu_variant_passes_verls_own_checks(tmp_path: Path) -> None:
    """`train 70b-3d --variant tp1pp1 --gpus 1 --layers 2` composes a layout verl 0.9.1 accepts (the
    check its `main_ppo` runs before Ray starts, and its Megatron engine configs); the recipe's own
    TP4 x PP2 on one GPU is refused by that same check, which is why the truncated runs need the variant."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl_recipes.recipe.run_config import launcher_settings
    from verl_recipes.workload import synth
    from verl_recipes.workload.arch import resolve_arch

    # What verl's model config reads from the checkpoint folder: config.json and the tokenizer.
    config = synth.hf_config(synth.shape_config(resolve_arch("llama-2-70b"), 2))
    synth.build_tokenizer(config).save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    recipe = get_recipe("70b-3d")
    extra = launcher_settings(recipe, tmp_path, Path("/d"), tmp_path / "run", 3, 1, 1)
    cfg = compose_recipe(recipe, ["tp1pp1"], extra=extra)
    assert need_critic(cfg) and not need_reference_policy(cfg)
    validate_config(cfg, use_reference_policy=False, use_critic=True)
    for node in (cfg.actor_rollout_ref.actor.megatron, cfg.critic.megatron):
        engine = omega_conf_to_dataclass(node)
        assert (engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size) == (1, 1)
        assert engine.sequence_parallel is False  # verl turns it off at TP1
        assert engine.override_transformer_config["attention_backend"] == "fused"
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    plain = compose_recipe(recipe, [], extra=extra)
    with pytest.raises(AssertionError, match=r"n_gpus \(1\) must be divisible by model_parallel_size \(8\)"):
        validate_config(plain, use_reference_policy=False, use_critic=True)


def test_configs_read_in_c_are_the_configs_omegaconf_reads(root: Path, tmp_path: Path) -> None:
    """`load_config` (libyaml's parser under OmegaConf's rules) gives what `OmegaConf.load` gives for
    a committed run's saved config of each recipe and every recipe delta, keeps OmegaConf's float,
    timestamp and duplicate-key rules, and fails where OmegaConf fails."""
    from verl_recipes.recipe.compose import load_config

    runs = [next(iter(sorted(d.glob("results/*/verl_config.yaml"))), None) for d in sorted(root.glob("recipes/*/"))]
    files = [*(r for r in runs if r), *root.glob("recipes/*/config*.yaml")]
    assert len(files) > 15
    for path in files:
        assert OmegaConf.to_container(load_config(path)) == OmegaConf.to_container(OmegaConf.load(path)), path
    rules = tmp_path / "rules.yaml"
    rules.write_text("lr: 1e-6\nwhen: 2026-12-06\nref: ${lr}\nn: 1_000\nempty:\n")
    want = {"lr": 1e-6, "when": "2026-12-06", "ref": "${lr}", "n": 1000, "empty": None}
    assert OmegaConf.to_container(load_config(rules)) == want
    twice = tmp_path / "twice.yaml"
    twice.write_text("a: 1\na: 2\n")
    with pytest.raises(Exception, match="duplicate key a"):
        load_config(twice)
