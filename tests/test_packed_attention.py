"""The packed attention implementation: segmentation from position ids, and equality with padded SDPA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from verl_recipes.worker import packed_attention  # noqa: E402


def test_cu_seqlens_from_restarting_position_ids() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu, max_len = packed_attention.cu_seqlens(pos)
    assert cu.tolist() == [0, 3, 5, 9]
    assert cu.dtype == torch.int32
    assert max_len == 4


def _tiny_model(attn: str) -> object:
    cfg = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    model.config._attn_implementation = attn
    return model.eval()


def _packed_vs_padded(device: str, dtype: object, atol: float) -> None:
    packed_attention.register()
    model = _tiny_model("sdpa").to(device=device, dtype=dtype)
    lengths = [5, 9, 3]
    torch.manual_seed(1)
    seqs = [torch.randint(0, 64, (n,), device=device) for n in lengths]
    padded_logits = []
    with torch.no_grad():
        for s in seqs:
            padded_logits.append(model(input_ids=s[None]).logits[0])
        model.config._attn_implementation = packed_attention.NAME
        ids = torch.cat(seqs)[None]
        pos = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        packed = model(input_ids=ids, position_ids=pos).logits[0]
    torch.testing.assert_close(packed, torch.cat(padded_logits), atol=atol, rtol=0)


def test_packed_fallback_equals_per_sequence_sdpa_on_cpu() -> None:
    _packed_vs_padded("cpu", torch.float32, 1e-5)


@pytest.mark.gpu
def test_varlen_attn_equals_sdpa_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _packed_vs_padded("cuda", torch.bfloat16, 5e-2)


def test_a_soft_capped_or_windowed_layer_is_refused_not_miscomputed() -> None:
    q = torch.zeros(1, 2, 6, 4)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1]])
    out, _ = packed_attention.varlen_attention_forward(object(), q, q, q, None, position_ids=pos, sliding_window=4)
    assert out.shape == (1, 6, 2, 4)  # a window as long as the longest sequence masks nothing
    with pytest.raises(ValueError, match="no sliding window"):
        packed_attention.varlen_attention_forward(object(), q, q, q, None, position_ids=pos, sliding_window=3)
    with pytest.raises(ValueError, match="soft-capping"):
        packed_attention.varlen_attention_forward(object(), q, q, q, None, position_ids=pos, softcap=50.0)


def test_sdpa_attends_across_packed_sequences() -> None:
    """Why padding removal needs torch_varlen here: sdpa ignores the restarting position ids."""
    model = _tiny_model("sdpa")
    lengths = [5, 9, 3]
    torch.manual_seed(1)
    seqs = [torch.randint(0, 64, (n,)) for n in lengths]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=s[None]).logits[0] for s in seqs])
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        packed = model(input_ids=torch.cat(seqs)[None], position_ids=pos).logits[0]
    first = lengths[0]
    torch.testing.assert_close(packed[:first], alone[:first], atol=1e-5, rtol=0)  # nothing before it
    assert float((packed[first:] - alone[first:]).abs().max()) > 1e-2  # the later ones see the earlier


def test_preflight_refuses_padding_removal_with_sdpa(root: object) -> None:
    from verl_recipes import RecipeError
    from verl_recipes.predict.setup import load_setup

    with pytest.raises(RecipeError) as e:
        load_setup("7b-lora", variants=["packed"], sets=["critic.model.override_config.attn_implementation=sdpa"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("critic.model.use_remove_padding=true") and "torch_varlen" in msg
    _, setup, _ = load_setup("7b-lora", variants=["packed"], sets=[])
    assert setup.remove_padding
