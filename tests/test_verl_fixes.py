"""verl 0.9.1's bugs and slow paths, shown with verl's own code and then with our fixes.

All run on tiny Llama models on the CPU; flash-attn is not installed here (it has no PyPI wheel),
which is exactly the situation of the recipes' users. The merged LoRA sync runs on a real FSDP2
module (one gloo rank).
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

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
    fixes = ["critic-attn-implementation", "critic-lora-token-cls", "lora-merge-out-of-place", "logprobs-chunked"]
    fixes += ["critic-engine-batching", "ray-local-start", "packed-attention", "replay-buffer-poll"]
    fixes += ["megatron-weights-exact-pinned", "megatron-optimizer-exact-pinned", "lora-layered-summon-fsdp1"]
    assert applied == fixes
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


# --- the merged LoRA weight sync (fix 4) ---------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp2_lora() -> Any:
    """A tiny bf16 Llama with a non-zero LoRA adapter, wrapped as verl wraps it (FSDP2 per layer and
    the root), and the weights peft's own merge gives for it (computed before wrapping)."""
    import copy
    import socket

    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl_recipes.worker import sync_probe

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
    )
    cfg.vocab_size = 256
    torch.manual_seed(0)
    peft_model = get_peft_model(
        LlamaForCausalLM(cfg).to(torch.bfloat16), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    )
    assert sync_probe.init_lora_b(peft_model, 0.1) == 14
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for layer in peft_model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(peft_model)
    yield peft_model, merged
    dist.destroy_process_group()


def _engine_on_cpu(monkeypatch: pytest.MonkeyPatch, module: Any) -> tuple[Any, types.SimpleNamespace]:
    """verl's FSDPEngine class and a stand-in `self` on this CPU host: verl 0.9.1 registers no CPU
    platform, so its device query is pointed at the CPU, and its GPU memory log line is muted."""
    import verl.utils.device as vdevice
    from verl.workers.engine.fsdp import transformer_impl

    monkeypatch.setattr(vdevice, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(transformer_impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(transformer_impl, "log_gpu_memory_usage", lambda *a, **k: None)
    return transformer_impl.FSDPEngine, types.SimpleNamespace(module=module, _is_offload_param=False)


def _params(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in module.state_dict().items()}


def _backups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes of each CPU restore point verl's merged sync takes (a spy on verl's own function)."""
    import verl.utils.fsdp_utils as fsdp_utils

    sizes: list[int] = []
    original = fsdp_utils.backup_base_model_weights

    def spy(module: Any) -> dict[str, torch.Tensor]:
        backup = original(module)
        sizes.append(sum(t.numel() * t.element_size() for t in backup.values() if t.device.type == "cpu"))
        return backup

    monkeypatch.setattr(fsdp_utils, "backup_base_model_weights", spy)
    return sizes


def test_verl_merged_sync_round_trips_every_base_weight_through_the_cpu(
    fsdp2_lora: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, merged = fsdp2_lora
    verl_fixes.apply()
    _, me = _engine_on_cpu(monkeypatch, module)
    backups = _backups(monkeypatch)
    original = verl_fixes.ORIGINALS["_merged_lora_per_tensor_param"]
    sent = {name: t.clone() for name, t in original(me)}  # a sender that copies each tensor as it comes
    base_bytes = sum(t.numel() * t.element_size() for k, t in _params(module).items() if "lora_" not in k)
    assert backups == [base_bytes], "verl copies every base weight to the CPU once per sync"
    assert all(torch.equal(sent[k], merged[k]) for k in merged)
    # A sender that keeps references and flushes after the stream ends (verl's own docstring warns
    # of it) gets the restored base weights: on one rank full_tensor() aliases the live storage.
    held = dict(original(me))
    assert not all(torch.equal(held[k], merged[k]) for k in merged)


def test_fixed_merged_sync_streams_peft_merge_out_of_place(fsdp2_lora: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module, merged = fsdp2_lora
    verl_fixes.apply()
    engine, me = _engine_on_cpu(monkeypatch, module)
    backups = _backups(monkeypatch)
    before = _params(module)
    held = dict(engine._merged_lora_per_tensor_param(me))
    assert backups == [], "no restore point: the training parameters are never written"
    assert sorted(held) == sorted(merged)
    assert all(torch.equal(held[k], merged[k]) for k in merged), "bit for bit what peft's merge gives"
    after = _params(module)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_probe_control_sends_the_base_weights_without_the_adapter(
    fsdp2_lora: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_recipes.worker import sync_probe

    module, merged = fsdp2_lora
    verl_fixes.apply()
    engine, me = _engine_on_cpu(monkeypatch, module)
    monkeypatch.setattr(sync_probe, "_syncs", 0)
    monkeypatch.setenv(sync_probe.ENV_DROP_SYNCS, "1")
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in _params(module).items()}
    syncs = [dict(engine._merged_lora_per_tensor_param(me)) for _ in range(3)]
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(syncs[0][q], merged[q]) and torch.equal(syncs[2][q], merged[q])
    assert torch.equal(syncs[1][q], base[q]) and not torch.equal(base[q], merged[q])


def test_setup_hook_imports_nothing_heavy_and_fixes_apply_on_import(tmp_path: Path) -> None:
    """Ray runs the hook in every worker; the fixes must wait for verl's own import of the module."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from verl_recipes.worker import hooks\n"
        "hooks.setup()\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'verl.utils.model') if m in sys.modules]\n"
        "print('heavy', heavy)\n"
        "from verl.workers.engine.fsdp import transformer_impl as ti\n"
        "import verl.utils.model as vm\n"
        "print('patched', hasattr(ti.FSDPEngine._merged_lora_per_tensor_param, '__wrapped__'),"
        " hasattr(ti.FSDPEngine._build_lora_module, '__wrapped__'), vm.load_valuehead_model.__module__)\n"
        "from verl.utils import torch_functional as tf\n"
        "print('logprobs', tf.logprobs_from_logits_v2.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "heavy []" in out
    assert "patched True True verl_recipes.worker.verl_fixes" in out
    assert "logprobs logprobs_from_logits_chunked" in out


def _logprob_case(dtype: torch.dtype, tokens: int = 300, vocab: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(tokens, vocab, generator=g) * 3).to(dtype).requires_grad_(True)
    return logits, torch.randint(0, vocab, (tokens,), generator=g)


def _autograd_nodes(out: torch.Tensor) -> int:
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo += [f for f, _ in fn.next_functions]
    return len(seen)


def test_verl_logprobs_loop_once_per_token() -> None:
    """verl's fallback (no flash-attn) builds a log_softmax, a gather and a squeeze per token of the
    2-D logits its FSDP engine hands it: the autograd graph grows with the tokens."""
    verl_fixes.apply()
    from verl.utils import torch_functional

    original = verl_fixes.ORIGINALS.get("logprobs_from_logits_v2", torch_functional.logprobs_from_logits_v2)
    small, large = (_autograd_nodes(original(*_logprob_case(torch.bfloat16, tokens=n))) for n in (100, 300))
    assert large - small >= 3 * 200, (small, large)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fixed_logprobs_take_chunks_and_give_verls_values_and_gradients(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    verl_fixes.apply()
    from verl.utils import torch_functional

    assert torch_functional.logprobs_from_logits_v2 is verl_fixes.logprobs_from_logits_chunked
    original = verl_fixes.ORIGINALS["logprobs_from_logits_v2"]
    # 300 tokens of a 512 vocabulary in chunks of 128 rows: three chunks, the last one short
    monkeypatch.setattr(verl_fixes, "LOGPROB_CHUNK_ELEMENTS", 128 * 512)
    theirs_in, labels = _logprob_case(dtype)
    ours_in = theirs_in.detach().clone().requires_grad_(True)
    theirs, ours = original(theirs_in, labels), torch_functional.logprobs_from_logits(ours_in, labels)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape == labels.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert _autograd_nodes(ours) < 30
    weights = torch.linspace(-1, 1, labels.numel())
    (theirs.float() * weights).sum().backward()
    (ours.float() * weights).sum().backward()
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=0, atol=0)
    # 3-D logits (verl's other callers) and an empty batch keep their shapes
    x3, l3 = theirs_in.detach()[:300].reshape(3, 100, 512), labels.reshape(3, 100)
    torch.testing.assert_close(torch_functional.logprobs_from_logits(x3, l3), original(x3, l3), rtol=0, atol=0)
    assert torch_functional.logprobs_from_logits(x3[:0], l3[:0]).shape == (0, 100)


def _critic_engine(sets: list[str], fixed: bool) -> Any:
    """The critic's engine config as verl 0.9.1's trainer builds it (trainer/ppo/v1/trainer_base.py:
    the dataclass from the composed config, then both token budgets from ppo_infer_max_token_len)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import critic as critic_config
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe

    verl_fixes.apply()
    cfg = compose_recipe(get_recipe("7b-lora"), None, sets)
    cls = critic_config.FSDPCriticConfig
    post = cls.__post_init__
    if not fixed:
        cls.__post_init__ = verl_fixes.ORIGINALS["FSDPCriticConfig.__post_init__"]  # type: ignore[method-assign]
    from omegaconf import OmegaConf

    section = OmegaConf.to_container(cfg.critic, resolve=True)
    assert isinstance(section, dict)
    section.pop("model")  # an HF model config loads files; batching does not depend on it
    try:
        c = omega_conf_to_dataclass(OmegaConf.create(section))
    finally:
        cls.__post_init__ = post  # type: ignore[method-assign]
    c.engine.infer_max_token_len_per_gpu = c.ppo_infer_max_token_len_per_gpu
    c.engine.max_token_len_per_gpu = c.ppo_infer_max_token_len_per_gpu
    return c.engine


def test_verl_gives_the_critic_a_token_budget_and_never_its_micro_batch() -> None:
    engine = _critic_engine(["critic.ppo_micro_batch_size_per_gpu=2"], fixed=False)
    assert engine.use_dynamic_bsz is True and engine.micro_batch_size_per_gpu is None
    assert engine.max_token_len_per_gpu == 32768


@pytest.mark.parametrize(
    "sets, dynamic, micro, budget",
    [
        (["critic.ppo_micro_batch_size_per_gpu=2"], False, 2, None),
        (["critic.ppo_micro_batch_size_per_gpu=8"], False, 8, None),
        (["critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=4096"], True, None, 4096),
    ],
)
def test_fixed_critic_engine_takes_the_critics_own_batching(
    sets: list[str], dynamic: bool, micro: int | None, budget: int | None
) -> None:
    engine = _critic_engine(sets, fixed=True)
    assert engine.use_dynamic_bsz is dynamic
    if micro is not None:
        assert engine.micro_batch_size_per_gpu == micro and engine.infer_micro_batch_size_per_gpu == micro
    if budget is not None:
        assert engine.max_token_len_per_gpu == engine.infer_max_token_len_per_gpu == budget


_PACKED_MODEL = (
    "import sys, torch, transformers\n"
    "from verl_recipes.worker import verl_fixes\n"
    "if sys.argv[2] == 'fixed':\n"
    "    verl_fixes.apply()\n"
    "import verl.workers.config.model  # verl builds its HF model configs here\n"
    "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1], attn_implementation='torch_varlen')\n"
    "try:\n"
    "    model = transformers.AutoModelForCausalLM.from_config(cfg)\n"
    "except Exception as e:\n"
    "    print('refused', type(e).__name__, str(e)[:200]); raise SystemExit(0)\n"
    "impl = model.eval().config._attn_implementation\n"
    "lens = [4, 7]\n"
    "ids = torch.randint(0, cfg.vocab_size, (1, sum(lens)))\n"
    "pos = torch.cat([torch.arange(n) for n in lens])[None]\n"
    "with torch.no_grad():\n"
    "    packed = model(input_ids=ids, position_ids=pos).logits[0]\n"
    "    model.config._attn_implementation = 'sdpa'\n"
    "    alone = torch.cat([model(input_ids=s[None]).logits[0] for s in ids[0].split(lens)])\n"
    "print('built', impl, float((packed - alone).abs().max()))\n"
)


@pytest.mark.parametrize("mode", ["verl", "fixed"])
def test_packed_attention_is_known_where_verl_builds_models(value_model_dir: Path, mode: str) -> None:
    """verl's padding-free path needs an attention that keeps packed sequences apart; without
    flash-attn, transformers knows none by name unless the fix registers torch's varlen kernel."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PACKED_MODEL, str(value_model_dir), mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    if mode == "verl":
        assert "refused" in out and "torch_varlen" in out, out
    else:
        built, err = out.split()[-2:]
        assert built == "torch_varlen" and float(err) < 1e-5, out


def _replay_kwargs() -> dict[str, Any]:
    """What verl's v1 trainer passes for a synchronous run (trainer_base._build_replay_buffer: no
    poll_interval)."""
    from omegaconf import OmegaConf

    return {
        "trainer_config": OmegaConf.create({}),
        "max_off_policy_threshold": None,
        "max_off_policy_strategy": "drop",
        "sampler_kwargs": OmegaConf.create({}),
        "train_batch_size": 8,
        "gen_batch_size": 8,
    }


def _one_poll_s(rb: Any) -> float:
    import time

    t0 = time.perf_counter()
    rb._wait_for_next_poll("train", time.time())
    return time.perf_counter() - t0


def test_verl_waits_two_seconds_between_looks_for_finished_rollouts() -> None:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    rb = ReplayBuffer.__new__(ReplayBuffer)
    # verl's own constructor, also where an earlier test applied the fixes in this process
    getattr(ReplayBuffer.__init__, "__wrapped__", ReplayBuffer.__init__)(rb, trainer_mode="sync", **_replay_kwargs())
    assert rb.poll_interval == 2.0
    assert _one_poll_s(rb) >= 2.0


def test_fixed_replay_buffer_looks_every_fraction_of_a_second() -> None:
    verl_fixes.apply()
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    rb = ReplayBuffer(trainer_mode="sync", **_replay_kwargs())
    assert rb.poll_interval == verl_fixes.REPLAY_POLL_S
    assert _one_poll_s(rb) < 0.5
    # the asynchronous trainers read poll_interval for their own bookkeeping: left as verl has it
    assert ReplayBuffer(trainer_mode="async", **_replay_kwargs()).poll_interval == 2.0


def _layered_summon_probe(tmp_path: Path, ranks: int) -> list[dict[str, Any]]:
    """tests/fixtures/fsdp1_layered_summon.py as `ranks` real gloo processes: each rank's record."""
    import os
    import socket
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = root / "tests" / "fixtures" / "fsdp1_layered_summon.py"
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(root / "common")}
    proc = subprocess.run([*run, str(probe), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


def _gathers_the_adapter_alone(r: dict[str, Any]) -> None:
    from verl_recipes.fixes import LAYERED_SUMMON_FIX

    assert LAYERED_SUMMON_FIX in r["applied"]
    assert r["verls"] == 0, "verl's own layered summon found the adapter: the fix may be obsolete"
    assert len(r["whole"]) == 2 * 7 * 2  # layers x linear layers x (A, B)
    assert r["fixed"] == r["whole"]
    assert len(r["summoned"]) == len(r["whole"])
    assert all(n.endswith((".lora_A.default", ".lora_B.default")) for n in r["summoned"]), r["summoned"]


def test_fsdp1_adapter_sync_gathers_the_adapter_alone(tmp_path: Path) -> None:
    """verl 0.9.1's layered summon under FSDP1, as two real gloo processes: verl's own function
    finds nothing (its LoRA wrap policy makes each adapter leaf a unit whose parameter is `weight`),
    so verl falls back to gathering the whole model to every rank's host. With the fix,
    `collect_lora_params(layered_summon=True)` summons the adapter's 28 leaf units alone (no
    decoder layer, not the root: no base weight is gathered) and returns on each rank the very
    tensors, under the very names, that the whole-model summon's adapter has, though each rank
    holds half the model."""
    for r in _layered_summon_probe(tmp_path, 2):
        _gathers_the_adapter_alone(r)
        assert r["shard_numel"] * 2 == r["model_numel"]  # each rank holds half: the values were gathered


def test_fsdp1_adapter_sync_on_one_gpu_runs_with_the_fix_alone(tmp_path: Path) -> None:
    """On one rank FSDP1 keeps the model unsharded (NO_SHARD), and verl's fallback, a summon to the
    CPU, refuses it: a one-GPU FSDP1 job with a LoRA adapter and `rollout.layered_summon` stops at
    its first adapter sync. The fix's summon stays on the device and returns the adapter."""
    (r,) = _layered_summon_probe(tmp_path, 1)
    assert r["verl_collect"].startswith("NotImplementedError: offload_to_cpu=True and NO_SHARD"), r["verl_collect"]
    _gathers_the_adapter_alone(r)
    assert r["shard_numel"] == r["model_numel"]
