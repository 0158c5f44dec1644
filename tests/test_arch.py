"""The bundled architectures and the table from Hugging Face model ids to them.

The recipes' memory claims start from these counts, so each bundled config must build the model
its name promises (the real HF module on the meta device, against the published size), the
planner must count what that module holds, and each recipe.yaml must state the count of the arch
it names. A model id resolves only through the written table.
"""

from __future__ import annotations

from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.predict.model import FAMILIES, Arch
from verl_recipes.recipe.metadata import discover
from verl_recipes.workload.arch import MODEL_IDS, NOT_BUNDLED, arch_for_model_id, bundled_archs, resolve_arch
from verl_recipes.workload.synth import count_params

# The real module's count of each bundled config (embeddings counted once when tied). Each agrees
# with the size its model card or Hub page publishes, rounded as published (archs/SOURCES.md).
KNOWN = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "qwen2-7b": 7_615_616_512,
    "qwen2-0.5b": 494_032_768,
    "qwen2-7b-instruct": 7_615_616_512,  # 7.62B
    "qwen2.5-0.5b": 494_032_768,  # 0.49B, 0.36B non-embedding
    "qwen2.5-1.5b": 1_543_714_304,  # 1.54B, 1.31B
    "qwen2.5-3b": 3_085_938_688,  # 3.09B, 2.77B
    "qwen2.5-7b": 7_615_616_512,  # 7.61B, 6.53B
    "qwen2.5-7b-instruct": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,  # 14.7B
    "qwen2.5-14b-instruct": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,  # the card says 32.5B; SOURCES.md
    "qwen2.5-32b-instruct": 32_763_876_352,
    "qwen2.5-72b-instruct": 72_706_203_648,  # 72.7B
    "qwen2.5-math-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,  # 0.6B, 0.44B non-embedding
    "qwen3-1.7b": 1_720_574_976,  # 1.7B, 1.4B
    "qwen3-4b": 4_022_468_096,  # 4.0B, 3.6B
    "qwen3-8b": 8_190_735_360,  # 8.2B, 6.95B
    "qwen3-14b": 14_768_307_200,  # 14.8B, 13.2B
    "qwen3-32b": 32_762_123_264,  # 32.8B, 31.2B
    "llama-3.1-8b": 8_030_261_248,  # 8.03B
    "llama-3.2-3b": 3_212_749_824,  # 3.21B
    "deepseek-llm-7b-chat": 6_910_365_696,  # 6.91B
    "mistral-7b-v0.1": 7_241_732_096,  # 7.24B
    "mistral-nemo-instruct-2407": 12_247_782_400,  # 12.2B
    "gemma-2-2b-it": 2_614_341_888,  # 2.61B
    "gemma-2-9b-it": 9_241_705_984,  # 9.24B
}


def test_every_bundled_arch_has_a_known_count() -> None:
    assert sorted(KNOWN) == bundled_archs()


@pytest.mark.parametrize("arch", sorted(KNOWN))
def test_bundled_arch_param_count(arch: str) -> None:
    """The meta-device module, the published size and the planner's arithmetic agree."""
    cfg = resolve_arch(arch)
    assert count_params(cfg) == KNOWN[arch]
    assert Arch.from_config(cfg).params() == KNOWN[arch]


# A config that leaves every family default to transformers: the widths make head_dim, tying and
# the norms visible in the count (hidden // heads = 16 differs from Qwen3's 128 and Gemma's 256).
_BARE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "vocab_size": 300,
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_defaults_are_transformers_own(model_type: str) -> None:
    from transformers import AutoConfig

    cfg = {"model_type": model_type, **_BARE}
    fam = FAMILIES[model_type]
    hf: Any = AutoConfig.for_model(model_type, **_BARE)
    assert bool(hf.tie_word_embeddings) == fam.tie_embeddings
    assert (getattr(hf, "head_dim", None) or 64 // 4) == (fam.head_dim or 64 // 4)  # Qwen2Config has none
    assert getattr(hf, "sliding_window", None) == (fam.sliding_window if model_type != "qwen2" else None)
    assert getattr(hf, "final_logit_softcapping", None) == fam.logit_softcap
    assert Arch.from_config(cfg).params() == count_params(cfg)  # norms, q/k norms, biases, tying


def test_qwen3_and_gemma2_layers_by_hand() -> None:
    q = Arch.from_config(resolve_arch("qwen3-8b"))
    h, d = 4096, 128
    attn = h * 32 * d + 2 * h * 8 * d + 32 * d * h
    assert q.layer_params() == attn + 3 * h * 12288 + 2 * h + 2 * d  # + q_norm, k_norm over head_dim
    g = Arch.from_config(resolve_arch("gemma-2-2b-it"))  # no tie_word_embeddings key: tied, as Gemma2Config
    assert (g.tie_embeddings, g.head_dim, g.norms_per_layer, g.logit_softcap) == (True, 256, 4, True)
    assert g.q_dim == 2048 != g.hidden  # head_dim 256 x 8 heads, not hidden_size
    # activations: four norms (6h each), q/k/v/o inputs at head_dim 256, lse, MLP
    assert g.activation_bytes_per_token_layer() == 28 * 2304 + 4 * 2048 + 4 * 1024 + 4 * 8 + 8 * 9216
    assert q.activation_bytes_per_token_layer() == 16 * h + 4 * 4096 + 4 * 1024 + 4 * 32 + 8 * 12288 + 6 * (4096 + 1024)


def test_sliding_window_kv_for_one_sequence_by_hand() -> None:
    """vLLM holds window - 1 + max_num_batched_tokens tokens of a sequence in a windowed layer."""
    m = Arch.from_config(resolve_arch("mistral-7b-v0.1"))  # every layer slides 4096
    per_layer_token = 2 * 8 * 128 * 2
    assert m.sliding_layer_count == 32
    assert m.kv_bytes_for_sequence(32768, batched_tokens=8192) == 32 * per_layer_token * (4095 + 8192)
    assert m.kv_bytes_for_sequence(2048) == m.kv_bytes_per_token() * 2048  # shorter than the window
    g = Arch.from_config(resolve_arch("gemma-2-2b-it"))  # layers 0, 2, ... slide
    assert g.sliding_layer_count == 13
    g_tok = 2 * 4 * 256 * 2
    assert g.kv_bytes_for_sequence(8192, batched_tokens=2048) == g_tok * (13 * 8192 + 13 * (4095 + 2048))
    n = Arch.from_config(resolve_arch("mistral-nemo-instruct-2407"))  # sliding_window null: none
    assert n.sliding_layer_count == 0 and n.kv_bytes_for_sequence(100) == 100 * n.kv_bytes_per_token()
    q = Arch.from_config(resolve_arch("qwen2.5-7b"))  # use_sliding_window false
    assert q.sliding_layer_count == 0
    with pytest.raises(RecipeError, match="use_sliding_window=true"):
        Arch.from_config({**resolve_arch("qwen2.5-7b"), "use_sliding_window": True})


def test_an_unmodelled_model_type_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"model_type 'phi3'.*llama, mistral, qwen2, qwen3, gemma2"):
        Arch.from_config({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_BARE})


def test_recipe_params_match_their_arch() -> None:
    recipes = discover()
    assert recipes, "no recipes found"
    for rid, r in recipes.items():
        counted = count_params(dict(r.arch_config))
        assert r.model.params == counted, f"{rid}: recipe.yaml says {r.model.params}, its arch has {counted}"


def test_truncation_removes_whole_layers() -> None:
    """Layer count is the only difference between 7B and its 2-layer smoke model: 30 layers' worth."""
    from verl_recipes.workload.synth import shape_config

    cfg = resolve_arch("llama-2-7b")
    full, two = count_params(cfg), count_params(shape_config(cfg, layers=2))
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q,k,v,o + gate,up,down + two RMSNorms (MHA: kv = h)
    assert full - two == 30 * per_layer


# ---- model ids ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model_id", "arch"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),  # the base model's 131072-token context: its own folder
        ("~/models/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"),
        ("$HOME/models/Qwen3-8B", "qwen3-8b"),
        ("/data/ckpt/qwen2.5-3b-instruct/", "qwen2.5-3b"),  # case and a trailing slash
        ("Qwen/Qwen2.5-3B", "qwen2.5-3b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-llm-7b-chat"),
        ("google/gemma-2-2b-it", "gemma-2-2b-it"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistral-nemo-instruct-2407"),
    ],
)
def test_model_id_resolves_through_the_table(model_id: str, arch: str) -> None:
    assert arch_for_model_id(model_id) == arch


def test_every_table_row_names_a_bundled_arch_and_no_id_is_both() -> None:
    bundled = set(bundled_archs())
    assert set(MODEL_IDS.values()) <= bundled
    assert not {k.lower() for k in MODEL_IDS} & {k.lower() for k in NOT_BUNDLED}


def test_an_unknown_id_is_one_line_with_the_way_out() -> None:
    with pytest.raises(RecipeError) as e:
        arch_for_model_id("Qwen/Qwen2.5-7B-Instrct")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("unknown model id Qwen/Qwen2.5-7B-Instrct: pass --arch NAME|config.json; bundled: ")
    assert "qwen3-8b" in msg and msg.endswith("did you mean Qwen2.5-7B-Instruct?")
    with pytest.raises(RecipeError, match=r"\(a multimodal model; .*\): pass --arch") as e:
        arch_for_model_id("Qwen/Qwen2.5-VL-7B-Instruct")
    assert "did you mean" not in str(e.value)  # not pointed at its text-only namesake
    with pytest.raises(RecipeError, match="mixture-of-experts"):
        arch_for_model_id("Qwen/Qwen3-30B-A3B-Base")
    with pytest.raises(RecipeError, match="unknown model id Qwen/Qwen3-8B-Base"):
        arch_for_model_id("Qwen/Qwen3-8B-Base")  # a variant is a row of its own, never a guess


# Every model the FSDP/GRPO/PPO examples of verl name, as read at verl commit b178a3cd5
# (`git grep -o "model.path=[^ ]*" -- examples/` and the MODEL_PATH-style assignments): each one
# resolves or says why not.
VERL_EXAMPLE_IDS = (
    "Qwen/Qwen2-7B-Instruct",
    "deepseek-ai/deepseek-llm-7b-chat",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-7B",
    "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-32B",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen2.5-Math-7B",
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-32B",
    "google/gemma-2-2b-it",
    "mistralai/Mistral-Nemo-Instruct-2407",
    "Qwen/Qwen2-72B-Instruct",
    "Qwen/Qwen2.5-Coder-14B-Instruct",
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen/Qwen3-30B-A3B-Base",
    "Skywork/Skywork-Reward-V2-Llama-3.2-3B",
    "sfairXC/FsfairX-LLaMA3-RM-v0.1",
    "ByteDance-Seed/Seed-OSS-36B-Base",
)


@pytest.mark.parametrize("model_id", VERL_EXAMPLE_IDS)
def test_verl_example_ids_resolve_or_say_why(model_id: str) -> None:
    name = model_id.rsplit("/", 1)[-1]
    if name in NOT_BUNDLED:
        with pytest.raises(RecipeError, match=f"unknown model id {model_id} \\("):
            arch_for_model_id(model_id)
    else:
        assert arch_for_model_id(model_id) in bundled_archs()
