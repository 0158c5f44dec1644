"""Parameter counts of the bundled architectures, from the real HF modules on the meta device.

The recipes' memory claims start from these counts, so each bundled config must build the model
its name promises, and each recipe.yaml must state the count of the arch it names.
"""

from __future__ import annotations

import pytest
from verl_recipes.recipe.metadata import discover
from verl_recipes.workload.arch import bundled_archs, resolve_arch
from verl_recipes.workload.synth import count_params

# Published sizes of the real checkpoints (embeddings counted once when tied, as in qwen2-0.5b).
KNOWN = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "qwen2-7b": 7_615_616_512,
    "qwen2-0.5b": 494_032_768,
}


def test_every_bundled_arch_has_a_known_count() -> None:
    assert sorted(KNOWN) == bundled_archs()


@pytest.mark.parametrize("arch", sorted(KNOWN))
def test_bundled_arch_param_count(arch: str) -> None:
    assert count_params(resolve_arch(arch)) == KNOWN[arch]


def test_truncation_removes_whole_layers() -> None:
    """Layer count is the only difference between 7B and its 2-layer smoke model: 30 layers' worth."""
    from verl_recipes.workload.synth import shape_config

    cfg = resolve_arch("llama-2-7b")
    full, two = count_params(cfg), count_params(shape_config(cfg, layers=2))
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q,k,v,o + gate,up,down + two RMSNorms (MHA: kv = h)
    assert full - two == 30 * per_layer


def test_recipe_params_match_their_arch() -> None:
    recipes = discover()
    assert recipes, "no recipes found"
    for rid, r in recipes.items():
        counted = count_params(dict(r.arch_config))
        assert r.model.params == counted, f"{rid}: recipe.yaml says {r.model.params}, its arch has {counted}"
