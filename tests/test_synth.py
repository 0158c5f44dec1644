"""The synthetic checkpoint: written by the CLI, loaded by transformers, run forward and generate.

Everything goes through `load_for_check`, the same path a real HF checkpoint takes, so a
checkpoint that transformers would half-load (missing keys, wrong shapes) fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.workload.arch import resolve_arch
from verl_recipes.workload.synth import (
    IM_END,
    IM_START,
    _Tensor,
    count_params,
    load_for_check,
    model_dir,
    shape_config,
    synthesize,
    write_weights,
)

TEXT = "Ana has 17 apples and buys 25 more. How many apples does Ana have now? #### 42\nnaïve café 😀"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Through the CLI, as a user runs it."""
    out = tmp_path_factory.mktemp("llama") / "ckpt"
    assert main(["synth-model", "--arch", "llama-2-7b", "--scale", "tiny", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Through the API, with small shards so the sharded layout (and its index) is exercised."""
    out = tmp_path_factory.mktemp("qwen") / "ckpt"
    synthesize("qwen2-0.5b", out, scale="tiny", max_shard_bytes=30_000_000)
    return out


@pytest.fixture(scope="module", params=["llama", "qwen"])
def ckpt(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def loaded(ckpt: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of `ckpt` in its stored dtype, loaded once per checkpoint."""
    return load_for_check(ckpt)


def test_forward_and_greedy_generate(ckpt: Path) -> None:
    model, tok = load_for_check(ckpt, dtype=torch.float32)
    msgs = [{"role": "user", "content": "What is 2 + 3? Put the final answer after ####."}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all() and logits.std() > 0
    out = model.generate(**enc, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape[1] == enc["input_ids"].shape[1] + 5
    again = model.generate(**enc, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert torch.equal(out, again)
    assert isinstance(tok.decode(out[0, -5:]), str)


def test_weights_are_random_normal_and_norms_are_ones(loaded: tuple[Any, Any]) -> None:
    model, _ = loaded
    assert model.dtype == torch.bfloat16
    for name, p in model.named_parameters():
        x = p.detach().float()
        assert torch.isfinite(x).all(), name
        if "norm" in name:
            assert torch.equal(x, torch.ones_like(x)), name
        else:
            assert 0.015 < x.std().item() < 0.025, name
    assert model.get_input_embeddings().weight.shape[0] == model.config.vocab_size


def test_tokenizer_round_trips_and_fits_the_vocab(ckpt: Path, loaded: tuple[Any, Any]) -> None:
    _, tok = loaded
    cfg = json.loads((ckpt / "config.json").read_text())
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == TEXT
    assert len(ids) < len(TEXT)  # BPE merges learned something
    assert len(tok) == cfg["vocab_size"]
    assert max(tok.get_vocab().values()) == cfg["vocab_size"] - 1
    assert tok.bos_token_id == cfg["bos_token_id"]
    assert tok.eos_token_id == cfg["eos_token_id"]
    assert tok.pad_token_id == cfg["pad_token_id"]
    for t in (IM_START, IM_END):
        assert tok.convert_tokens_to_ids(t) < cfg["vocab_size"]
    # Every id a random model may emit decodes.
    top = list(range(cfg["vocab_size"] - 50, cfg["vocab_size"]))
    assert all(isinstance(s, str) for s in tok.convert_ids_to_tokens(top))


def test_special_ids_follow_the_arch_config(llama: Path, qwen: Path) -> None:
    _, lt = load_for_check(llama)
    assert (lt.pad_token_id, lt.bos_token_id, lt.eos_token_id) == (0, 1, 2)  # as Llama-2's config.json
    _, qt = load_for_check(qwen)
    assert qt.eos_token_id == 151643
    assert qt.convert_tokens_to_ids([IM_START, IM_END]) == [151644, 151645]  # where Qwen2 has them


def test_chat_template(loaded: tuple[Any, Any]) -> None:
    _, tok = loaded
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == f"{IM_START}system\nBe brief.{IM_END}\n{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n"
    no_gen = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert not no_gen.endswith("assistant\n")
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == tok.convert_tokens_to_ids(IM_START)
    assert ids.count(tok.convert_tokens_to_ids(IM_END)) == 2


def test_provenance_matches_what_was_written(ckpt: Path, loaded: tuple[Any, Any]) -> None:
    info = json.loads((ckpt / "synth.json").read_text())
    model, tok = loaded
    assert info["params"] == sum(p.numel() for p in model.parameters())
    files = sorted(ckpt.glob("model*.safetensors"))
    assert info["bytes"] == sum(f.stat().st_size for f in files)
    assert info["scale"] == "tiny" and info["layers"] == 2 == model.config.num_hidden_layers
    assert info["versions"]["torch"] == torch.__version__
    gen = json.loads((ckpt / "generation_config.json").read_text())
    # Generation stops at the end of a turn as well as at eos.
    assert gen["eos_token_id"] == [model.config.eos_token_id, tok.convert_tokens_to_ids(IM_END)]
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "bfloat16"


def test_sharded_layout(qwen: Path) -> None:
    shards = sorted(qwen.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and not (qwen / "model.safetensors").exists()
    index = json.loads((qwen / "model.safetensors.index.json").read_text())
    names = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for k in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                names[k] = shard.name
    assert index["weight_map"] == names
    assert "lm_head.weight" not in names  # tied to the embedding, written once as HF does
    assert index["metadata"]["total_size"] == sum(s.stat().st_size for s in shards) - sum(
        8 + int.from_bytes(s.read_bytes()[:8], "little") for s in shards
    )


def test_missing_weight_is_an_error(llama: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(llama, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RecipeError, match="lacks or mis-shapes 1 weights"):
        load_for_check(broken)


def test_weights_are_deterministic_in_the_seed(tmp_path: Path) -> None:
    plan = [_Tensor("a", (64, 32), "normal"), _Tensor("n", (32,), "ones"), _Tensor("b", (3, 5), "normal")]
    digests = []
    for i, seed in enumerate([0, 0, 1]):
        d = tmp_path / str(i)
        d.mkdir()
        write_weights(d, plan, seed=seed)
        digests.append((d / "model.safetensors").read_bytes())
    assert digests[0] == digests[1] != digests[2]
    t = load_file(str(tmp_path / "0" / "model.safetensors"))
    assert t["a"].dtype == torch.bfloat16 and t["a"].shape == (64, 32) and torch.equal(t["n"], torch.ones(32))


def test_shape_config_rules() -> None:
    tiny70 = shape_config(resolve_arch("llama-2-70b"), scale="tiny")
    widths = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "num_hidden_layers",
    )
    assert [tiny70[k] for k in widths] == [256, 688, 4, 4, 2]
    q = shape_config(resolve_arch("qwen2-0.5b"), layers=3, scale="tiny")
    assert q["num_key_value_heads"] == 2 and q["num_hidden_layers"] == 3 and q["max_window_layers"] == 3
    q7 = shape_config(resolve_arch("qwen2-7b"), layers=4)
    assert q7["hidden_size"] == 3584 and q7["max_window_layers"] == 4
    assert count_params(q) < 50_000_000
    with pytest.raises(RecipeError, match="--layers 33"):
        shape_config(resolve_arch("llama-2-7b"), layers=33)
    with pytest.raises(RecipeError, match="not a bundled arch"):
        resolve_arch("llama-9-1t")


def test_arch_by_path_and_refusing_a_foreign_folder(tmp_path: Path) -> None:
    cfg = resolve_arch("llama-2-7b")
    cfg["vocab_size"] = 1000
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    info = synthesize(str(tmp_path / "mine"), out, layers=1, scale="tiny")
    assert info["tokenizer_len"] == 1000 and info["layers"] == 1
    model, tok = load_for_check(out)
    assert model.config.vocab_size == 1000 and len(tok) == 1000
    # A rerun into its own output is allowed; a folder holding other things is not.
    synthesize(str(tmp_path / "mine"), out, layers=1, scale="tiny")
    with pytest.raises(RecipeError, match="not empty"):
        synthesize("llama-2-7b", tmp_path / "mine", scale="tiny")


@pytest.mark.slow
def test_full_width_truncated_7b(tmp_path: Path) -> None:
    """The smoke shape of the 7B recipe at full width: one real layer, real embedding sizes."""
    info = synthesize("llama-2-7b", tmp_path / "c", layers=1)
    assert info["params"] == count_params(shape_config(resolve_arch("llama-2-7b"), layers=1))
    model, _ = load_for_check(tmp_path / "c")
    assert model.model.layers[0].mlp.up_proj.weight.shape == (11008, 4096)


def test_a_weightless_checkpoint_has_the_full_models_config_and_tokenizer_only(tmp_path: Path) -> None:
    """What a Megatron rank rehearsal of 70B trains from: Llama-2-70B's whole config (80 layers at
    full width, 69 B parameters counted) and its tokenizer, no weight file, named apart from the
    checkpoint with weights so neither is ever taken for the other."""
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "noweights"
    main(["synth-model", "--arch", "llama-2-70b", "--no-weights", "--out", str(out)])
    info = json.loads((out / "synth.json").read_text())
    assert (info["weights"], info["bytes"], info["layers"]) == (False, 0, 80)
    assert info["params"] == count_params(shape_config(resolve_arch("llama-2-70b")))
    assert not list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    # the index Megatron-Bridge's weight export lists its names from: every weight of the HF
    # model, each in a shard that is not there (so nothing is ever loaded from it)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        names = set(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).state_dict())
    assert set(index["weight_map"]) == names and len(names) == 2 + 9 * 80 + 1
    assert not any((out / shard).exists() for shard in set(index["weight_map"].values()))
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.intermediate_size) == (8192, 8, 28672)
    assert len(AutoTokenizer.from_pretrained(out)) == info["tokenizer_len"]
    assert model_dir("llama-2-70b", None, "full-width", weights=False) != model_dir("llama-2-70b", None, "full-width")


# One tiny checkpoint per model type the bundled archs add beyond Llama and Qwen2, each with what
# sets it apart: Qwen3 (q/k norms, explicit head_dim, tied embeddings, 151,936 ids), Gemma 2
# (zero-centred norms, logit soft-capping, tied embeddings, two eos ids, 256,000 ids), Mistral
# (a sliding window, 32,000 ids).
@pytest.fixture(scope="module", params=["qwen3-0.6b", "gemma-2-2b-it", "mistral-7b-v0.1"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "ckpt"
    assert main(["synth-model", "--arch", request.param, "--scale", "tiny", "--out", str(out)]) == 0
    return request.param, out


def test_each_model_type_loads_runs_and_tokenizes(family: tuple[str, Path]) -> None:
    arch, ckpt = family
    raw = resolve_arch(arch)
    model, tok = load_for_check(ckpt, dtype=torch.float32)
    assert type(model).__name__ == raw["architectures"][0]
    info = json.loads((ckpt / "synth.json").read_text())
    assert info["params"] == sum(p.numel() for p in model.parameters()) == count_params(shape_config(raw, None, "tiny"))
    # norms at their module's own init: the identity scale (Gemma's x * (1 + w) needs w = 0)
    ident = 0.0 if raw["model_type"] == "gemma2" else 1.0
    norms = [(n, p) for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(torch.equal(p, torch.full_like(p, ident)) for _, p in norms)
    # the tokenizer covers the whole vocabulary and puts the config's special ids where it says
    assert len(tok) == raw["vocab_size"] == model.config.vocab_size
    eos = raw["eos_token_id"]
    assert tok.bos_token_id == raw["bos_token_id"] and tok.eos_token_id == (eos[0] if isinstance(eos, list) else eos)
    if raw.get("pad_token_id") is not None:
        assert tok.pad_token_id == raw["pad_token_id"]
    msgs = [{"role": "user", "content": "What is 2 + 3? Put the final answer after ####."}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert enc["input_ids"][0, 0] == tok.convert_tokens_to_ids(IM_START)
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape[-1] == raw["vocab_size"] and torch.isfinite(logits).all() and logits.std() > 0
    if raw.get("final_logit_softcapping"):
        assert logits.abs().max() <= raw["final_logit_softcapping"]
    assert isinstance(tok.decode([int(logits[0, -1].argmax())]), str)  # the greedy next token decodes
