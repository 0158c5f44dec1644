"""verl 0.9.1's critic bugs, shown failing with verl's own code and passing with our fixes.

Both run on a tiny Llama value model on the CPU; flash-attn is not installed here (it has no
PyPI wheel), which is exactly the situation of the recipes' users.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

from transformers import LlamaConfig, LlamaForTokenClassification
from verl_recipes.worker import verl_fixes


@pytest.fixture(scope="module")
def value_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        num_labels=1,
    )
    path = tmp_path_factory.mktemp("value")
    LlamaForTokenClassification(cfg).save_pretrained(path)
    return path


def _verl_original(name: str):  # type: ignore[no-untyped-def]
    import verl.utils.model as vmodel
    from verl.workers.engine.fsdp import transformer_impl

    if name == "load_valuehead_model":
        return verl_fixes.ORIGINALS.get(name, vmodel.load_valuehead_model)
    return verl_fixes.ORIGINALS.get(name, transformer_impl.FSDPEngine._build_lora_module)


def _engine_self(lora_rank: int = 8) -> types.SimpleNamespace:
    mc = types.SimpleNamespace(
        model_type="value_model",
        lora_rank=lora_rank,
        lora_alpha=16,
        target_modules="all-linear",
        target_parameters=None,
        exclude_modules=None,
        lora_adapter_path=None,
    )
    return types.SimpleNamespace(model_config=mc)


def test_verl_critic_loader_fails_without_flash_attn(value_model_dir: Path) -> None:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("flash-attn is installed here; verl's loader would work")
    cfg = LlamaConfig.from_pretrained(value_model_dir)
    with pytest.raises((RuntimeError, ImportError, ValueError)):
        _verl_original("load_valuehead_model")(str(value_model_dir), torch.float32, cfg, False)


def test_fixed_critic_loader_uses_the_configured_attention(value_model_dir: Path) -> None:
    cfg = LlamaConfig.from_pretrained(value_model_dir)
    cfg._attn_implementation = "sdpa"
    model = verl_fixes.load_valuehead_model(str(value_model_dir), torch.float32, cfg, False)
    assert type(model).__name__ == "LlamaForTokenClassification"
    assert model.config._attn_implementation == "sdpa"


def test_verl_critic_lora_fails(value_model_dir: Path) -> None:
    model = LlamaForTokenClassification.from_pretrained(value_model_dir)
    with pytest.raises(AttributeError, match="prepare_inputs_for_generation"):
        _verl_original("_build_lora_module")(_engine_self(), model)


def test_fixed_critic_lora_trains_adapters_and_value_head(value_model_dir: Path) -> None:
    applied = verl_fixes.apply()
    assert applied == ["critic-attn-implementation", "critic-lora-token-cls"]
    from verl.workers.engine.fsdp import transformer_impl

    model = LlamaForTokenClassification.from_pretrained(value_model_dir)
    peft_model = transformer_impl.FSDPEngine._build_lora_module(_engine_self(), model)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in trainable)
    assert any("score" in n and "lora" not in n for n in trainable), "the value head must train"
    out = peft_model(
        input_ids=torch.randint(0, 256, (2, 7)),
        attention_mask=torch.ones(2, 7, dtype=torch.long),
        position_ids=torch.arange(7).expand(2, 7),
    )
    assert out.logits.shape == (2, 7, 1)
    out.logits.sum().backward()


def test_fixes_leave_other_verl_versions_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_fixes, "verl_version", lambda: "0.10.0")
    assert verl_fixes.apply() == []
