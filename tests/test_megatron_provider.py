"""verl 0.9.1's Megatron engine with the pinned megatron-core / Megatron-Bridge / Transformer Engine.

The engine's inputs (recipe 70b-3d composed as `train` composes it, a truncated checkpoint) are
built on any CPU host. The rest needs the `[megatron]` group (Python 3.12: `PYTHONPATH=DIR` of the
wheelhouse's `install.sh --target DIR`, gpu/megatron-notes.md), so the Python 3.11 CI skips it
and says why. What runs without a GPU: verl's own `MegatronEngine._build_tf_config` on recipe 70b-3d as `train --variant
tp1pp1 --gpus 1 --layers 2` composes it, for the actor and the critic, down to the Megatron-Bridge
provider the model would be built from. Building the model needs CUDA (TE's modules refuse to
construct without it), so the weight round trip (Bridge loads the HF checkpoint into the TE model
and exports it back, as the sync to vLLM does) is marked `gpu`.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest


def _needs_megatron() -> None:
    pytest.importorskip(
        "megatron.bridge", reason="needs the [megatron] wheels (Python 3.12; gpu/megatron-notes.md, the wheelhouse)"
    )


@pytest.fixture(scope="module")
def one_rank() -> Any:
    """A one-process group and Megatron's parallel state at TP1 x PP1, as verl's engine makes them."""
    _needs_megatron()
    import torch
    from megatron.core import parallel_state as mpu

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not mpu.is_initialized():
        mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    yield mpu


def _checkpoint(out: Path, layers: int, scale: str, weights: bool) -> Path:
    from verl_recipes.workload import synth
    from verl_recipes.workload.arch import resolve_arch

    if weights:
        synth.synthesize("llama-2-70b", out, layers=layers, scale=scale, device="cpu")
        return out
    config = synth.hf_config(synth.shape_config(resolve_arch("llama-2-70b"), layers, scale))
    config.architectures = ["LlamaForCausalLM"]
    synth.build_tokenizer(config).save_pretrained(out)
    config.save_pretrained(out)
    return out


def _engine(model: Path, role: str, run: Path) -> Any:
    """The attributes of verl's MegatronEngine that `_build_tf_config` reads, from the composed config."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import Layout, compose_run

    # `train 70b-3d --variant tp1pp1 --gpus 1 --layers 2`: one GPU on one node, the run's own model
    cfg = compose_run(get_recipe("70b-3d"), ["tp1pp1"], [], Layout(1, 1), model=model, data=run, run_dir=run)
    node = cfg.actor_rollout_ref.actor.megatron if role == "actor" else cfg.critic.megatron
    model_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.model if role == "actor" else cfg.critic.model)
    if role == "critic":
        model_cfg.model_type = "value_model"  # what verl's critic worker sets
    return types.SimpleNamespace(
        engine_config=omega_conf_to_dataclass(node),
        model_config=model_cfg,
        enable_routing_replay=False,
        _qat_enabled=False,
        _qat_config=None,
    )


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_the_engines_inputs_compose_on_any_host(tmp_path: Path, role: str) -> None:
    """What verl's engine reads, from recipe 70b-3d composed for one GPU: built here on CPU, so a
    renamed module or helper fails on every host, not only where the Megatron wheels are."""
    model = _checkpoint(tmp_path / "m", 2, "full-width", weights=False)
    engine = _engine(model, role, tmp_path)
    ec = engine.engine_config
    assert (ec.tensor_model_parallel_size, ec.pipeline_model_parallel_size) == (1, 1)
    assert engine.model_config.path == str(model)
    assert (engine.model_config.model_type == "value_model") == (role == "critic")


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_verl_builds_the_recipes_provider(one_rank: Any, tmp_path: Path, role: str) -> None:
    from megatron.core.transformer.enums import AttnBackend
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    engine = _engine(_checkpoint(tmp_path / "m", 2, "full-width", weights=False), role, tmp_path)
    MegatronEngine._build_tf_config(engine)  # verl's code: Bridge provider, overrides, finalize
    p = engine.provider
    assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.sequence_parallel) == (1, 1, False)
    assert p.attention_backend == AttnBackend.fused
    assert (p.recompute_granularity, p.recompute_method, p.recompute_num_layers) == ("full", "uniform", 1)
    assert (p.num_layers, p.hidden_size, p.ffn_hidden_size) == (2, 8192, 28672)
    assert (p.num_attention_heads, p.num_query_groups, p.bf16) == (64, 8, True)
    assert p.variable_seq_lengths and not p.share_embeddings_and_output_weights


@pytest.mark.gpu
def test_bridge_round_trip_on_the_te_model(one_rank: Any, tmp_path: Path) -> None:
    """Megatron-Bridge loads the HF checkpoint into the TE model verl's provider builds and exports
    it back under the HF names, bit for bit: the calls verl makes to load the actor and to stream
    its weights to vLLM (tiny widths, 2 layers: seconds)."""
    from safetensors.torch import load_file
    from verl.models.mcore.bridge import AutoBridge
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    model_dir = _checkpoint(tmp_path / "m", 2, "tiny", weights=True)
    engine = _engine(model_dir, "actor", tmp_path)
    MegatronEngine._build_tf_config(engine)
    model = engine.provider.provide(pre_process=True, post_process=True).cuda()
    bridge = AutoBridge.from_hf_pretrained(str(model_dir))
    bridge.load_hf_weights([model], str(model_dir), allowed_mismatched_params=[])
    tasks = bridge.get_conversion_tasks([model])
    exported = {k: v.cpu() for k, v in bridge.export_hf_weights([model], conversion_tasks=tasks)}
    hf: dict[str, Any] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        hf.update(load_file(f))
    assert sorted(exported) == sorted(hf)
    for k, v in hf.items():
        assert exported[k].dtype == v.dtype and bool((exported[k] == v).all()), k


#: Modules verl's Megatron-path files name that do not import with the pins, and why recipe 70b-3d
#: never imports them (each is inside a function or a guarded import). A new failure, like
#: Megatron-Bridge's training config importing Megatron-Energon, fails the test below.
OFF_THE_PATH = {
    "nemo_automodel": "verl's Automodel engine; 70b-3d uses the Megatron engine",
    "torchtitan": "verl's TorchTitan engine",
    "veomni": "verl's VeOmni engine",
    "sglang": "the SGLang rollout; 70b-3d rolls out with vLLM",
    "megatron_fsdp": "the Automodel engine's FSDP",
    "mbridge": "verl's deprecated vanilla_mbridge path (use_mbridge with Megatron-Bridge is the default)",
    "modelopt": "QAT (verl.utils.modelopt) and Megatron-Bridge's PEFT and FSDP-DTensor checkpointing; "
    "70b-3d has no QAT, no PEFT and saves no checkpoint",
    "megatron.core.dist_checkpointing.strategies.base": "checkpoint.async_save only (gpu/megatron-notes.md 8)",
    "megatron.core.datasets.data_schedule.DefaultDynamicCPScheduler": "dynamic context parallel only",
}


def _named_modules(root: Path) -> dict[str, str]:
    """Every module (or `module.name`) that an import statement at any depth names in verl's files
    that mention Megatron or TE, with one place it is named: what the engine may import at run time."""
    import ast

    from verl_recipes.stack.mcore_api import _absolute

    named: dict[str, str] = {}
    for f in sorted(root.rglob("*.py")):
        text = f.read_text(errors="replace")
        if "megatron" not in text and "transformer_engine" not in text:
            continue
        mod = f.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(mod, f.name == "__init__.py", node.module, node.level)
                names = [target, *(f"{target}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name.startswith(("megatron", "transformer_engine", "verl")):
                    named.setdefault(name, f"{mod}:{node.lineno}")
    return named


def test_every_module_verls_megatron_path_names_imports_or_is_off_the_path() -> None:
    """Import, in this process, each module named above (a `from M import N` counts as found when N
    is an attribute of M). Only a ModuleNotFoundError on the OFF_THE_PATH list is allowed."""
    _needs_megatron()
    import importlib

    import verl

    failures = {}
    for name, where in _named_modules(Path(verl.__file__).parent).items():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            parent, _, attr = name.rpartition(".")
            if e.name == name and parent:
                try:
                    if hasattr(importlib.import_module(parent), attr):
                        continue
                except ModuleNotFoundError as pe:
                    e = pe
            if not any(str(e.name).startswith(m) or name.startswith(m) for m in OFF_THE_PATH):
                failures[name] = f"{where}: No module named {e.name!r}"
        except Exception as e:  # any other failure to import is a finding too
            failures[name] = f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    assert not failures, "\n".join(f"{k} ({v})" for k, v in sorted(failures.items()))
