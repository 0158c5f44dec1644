"""Rank rehearsal (`verl_recipes.worker.rank_rehearsal`): one GPU stands in for rank R of N.

The worker side runs for real here: Ray on this CPU, verl's own process-group call inside a Ray
worker that starts through the project's setup hook, FSDP2 sharding a small Llama over the group
it got. The driver side is checked on verl's real composed config and verl's own validation and
batch-multiple code. What only a GPU can show (vLLM, verl's whole step) is the GPU campaign's.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.layout import ENV_RANK, JOB_POOLS, RankSpec, adapter_slices, pool_share, rollout_stand_in
from verl_recipes.worker import rank_rehearsal

ROOT = Path(__file__).resolve().parents[1]


def test_rank_spec_reads_r_of_n_and_refuses_a_rank_outside_the_job() -> None:
    assert RankSpec.parse("1/4") == RankSpec(1, 4)
    assert RankSpec(0, 2).env_value == "0/2" and RankSpec(0, 2).label == "rank rehearsal (0 of 2)"
    with pytest.raises(RecipeError, match="--rank 2 is not a rank of this job's 2 GPU"):
        RankSpec(2, 2)
    with pytest.raises(RecipeError, match="expected R/N"):
        RankSpec.parse("0")


def test_a_ray_worker_asked_for_a_rank_holds_that_ranks_shards() -> None:
    pytest.importorskip("verl")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common"), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    env.pop(ENV_RANK, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "rank_rehearsal_probe.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    views = {v["mode"]: v for v in (json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{"))}
    plain, rank = views["plain"], views["rank1of4"]
    # without the variable: verl's own group of one, whole weights (the control)
    assert (plain["backend"], plain["world"], plain["patched"]) == ("cpu:gloo", 1, False)
    assert plain["local_shape"] == plain["full_shape"] == [64, 64]
    # with it: rank 1 of a fake world of 4 holds a quarter of each weight and of its gradient,
    # and the weight sync's gather still gives the whole tensor
    assert (rank["backend"], rank["world"], rank["rank"], rank["patched"]) == ("fake", 4, 1, True)
    assert rank["local_shape"] == rank["grad_local_shape"] == [16, 64]
    assert rank["full_shape"] == [64, 64]


def _job(recipe_id: str = "13b-fsdp", variants: list[str] | None = None, sets: list[str] | None = None) -> Any:
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    recipe = get_recipe(recipe_id)
    return compose_run(recipe, variants or [], sets or [], gpu_layout(recipe, None))


def _verls_batch_multiple() -> Any:
    """verl's own ``PPOTrainer._get_required_batch_multiple``, read from its source: the module
    that defines it imports TransferQueue, which a CPU host lacks."""
    import verl

    path = Path(inspect.getfile(verl)).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_get_required_batch_multiple")
    ns: dict[str, Any] = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns["_get_required_batch_multiple"]


def test_the_driver_runs_the_ranks_share_of_a_job_verl_accepts() -> None:
    pytest.importorskip("verl")
    from verl_recipes.recipe.start_checks import verl_validate
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    cfg = _job()
    shape = shape_config(resolve_arch("llama-2-13b"))
    verl_validate(cfg, shape)  # verl's own start-up checks pass on the whole job
    assert (cfg.trainer.n_gpus_per_node, cfg.data.train_batch_size) == (2, 8)
    spec = RankSpec(0, 2)
    changed = rank_rehearsal.localize(cfg, spec)
    assert changed == {
        "trainer.n_gpus_per_node": (2, 1),
        "data.train_batch_size": (8, 4),
        # the job's CPU worker pools, the rank's half of each (reward_model.num_workers is unset)
        "actor_rollout_ref.rollout.agent.num_workers": (2, 1),
        "reward.num_workers": (8, 4),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": (8, 4),
    }
    assert cfg.reward.num_workers == 4 and cfg.reward_model.num_workers is None
    # the driver pads a batch to lcm(DP, PPO mini-batches): verl's own arithmetic on the rank's
    # share would pad its 4 prompts back to the job's mini-batch of 8; the rank's share of the
    # job's multiple is 4
    verl_multiple = _verls_batch_multiple()
    me = SimpleNamespace(config=cfg, use_critic=True, global_steps=1)
    assert verl_multiple(me, 1) == 8
    assert rank_rehearsal._make_batch_multiple(verl_multiple, spec)(me, 1) == 4


def test_a_rank_of_a_large_job_runs_one_worker_of_each_pool() -> None:
    """A rank of 70b-3d's 32 GPUs holds 1/32 of the job's pools of eight: one of each, not the
    eight agent-loop, reward and storage workers (24 GiB of RSS on the host) the whole job spreads
    over its four nodes."""
    pytest.importorskip("verl")
    cfg = _job("70b-3d")
    arch = {"num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}
    arch |= {"intermediate_size": 28672, "vocab_size": 32000, "num_hidden_layers": 80}
    changed = rank_rehearsal.localize(cfg, RankSpec(16, 32), arch)
    for key in JOB_POOLS[:2] + JOB_POOLS[3:]:
        assert changed[key] == (8, 1), key
    assert pool_share(8, 32) == 1 and pool_share(8, 32, ranks=8) == 2
    assert pool_share(3, 2) == 2  # a share is whole workers, at least one


def test_a_tp2_rollout_becomes_one_tp1_replica_of_the_ranks_stand_in() -> None:
    pytest.importorskip("verl")
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    arch = shape_config(resolve_arch("llama-2-13b"))
    cfg = _job(variants=["40gib"])
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    changed = rank_rehearsal.localize(cfg, RankSpec(0, 2), arch)
    assert changed["actor_rollout_ref.rollout.tensor_model_parallel_size"] == (2, 1)
    # Llama-2-13B: 40 heads of 128, 40 KV heads, MLP 13824; a TP2 rank holds half of each
    stand_in = {"num_attention_heads": 20, "num_key_value_heads": 20, "intermediate_size": 6912, "head_dim": 128}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides == stand_in
    # KV heads are replicated, never below one a rank, once there are fewer than ranks (GQA)
    gqa = {"num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "hidden_size": 8192}
    assert rollout_stand_in(gqa, 16)["num_key_value_heads"] == 1


def test_a_qwen2_stand_in_keeps_its_heads_whole_since_vllm_sizes_them_from_the_hidden_size() -> None:
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    # Qwen2-7B: 28 heads of 128 over a hidden size of 3584; vLLM's Qwen2 would make 14 heads of 256
    qwen2 = shape_config(resolve_arch("qwen2-7b"))
    assert rollout_stand_in(qwen2, 2) == {"intermediate_size": 18944 // 2}
    # the same widths under a model class that reads head_dim split their heads
    assert rollout_stand_in({**qwen2, "model_type": "llama"}, 2)["num_attention_heads"] == 14


def _adapter(config: dict[str, Any]) -> dict[str, Any]:
    """PEFT's adapter state dict (the tensors verl's sync sends) of a small model of `config`."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=targets, init_lora_weights=False))
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft).items()}


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_a_tp2_stand_ins_adapter_is_rank_0s_slice_in_the_stand_ins_shapes(model_type: str) -> None:
    """verl's adapter sync sends each LoRA tensor whole; vLLM's TP1 stand-in holds rank 0's layer
    sizes and copies the tensor whole. Sliced, each tensor has the shape the stand-in's own LoRA
    tensor has (a model built at the stand-in's sizes), and holds rank 0's rows or columns, the
    ones vLLM's TP2 rank 0 keeps. The control: the whole tensors do not fit the stand-in."""
    pytest.importorskip("peft")
    full = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1}
    full |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128}
    sizes = rollout_stand_in(full, 2)
    whole, stand_in = _adapter(full), _adapter({**full, **sizes})
    slices = adapter_slices(full, sizes)
    # Qwen2's stand-in splits its MLP only (vLLM sizes its heads from the hidden size); Llama's both
    attention = {"q_proj", "k_proj", "v_proj", "o_proj"} if model_type == "llama" else set()
    split = {"gate_proj", "up_proj", "down_proj"} | attention
    assert {proj for proj, _ in slices} == split
    sliced = dict(rank_rehearsal.slice_adapter(whole.items(), slices))
    assert {k: tuple(v.shape) for k, v in sliced.items()} == {k: tuple(v.shape) for k, v in stand_in.items()}
    assert any(whole[k].shape != v.shape for k, v in stand_in.items())  # the control
    for name, tensor in sliced.items():
        rows, cols = tensor.shape
        assert tensor.is_contiguous() and (tensor == whole[name][:rows, :cols]).all(), name


def test_only_the_adapter_sync_to_a_stand_in_is_sliced() -> None:
    """The worker reads the stand-in's sizes from the localized rollout config (a real composed
    TP2 job), and verl's engine's `get_per_tensor_param` is wrapped so that the adapter-only sync
    (a PEFT config, `base_sync_done`) is sliced; the base weights' sync (vLLM's loaders narrow
    those themselves), a merged or full model's (no PEFT config) and a job without a stand-in are
    sent as verl sends them."""
    pytest.importorskip("verl")
    pytest.importorskip("peft")
    from transformers import AutoConfig

    cfg = _job(variants=["40gib"])
    assert rank_rehearsal.rollout_sizes(cfg.actor_rollout_ref.rollout) == {}
    arch = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1}
    arch |= {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128}
    rank_rehearsal.localize(cfg, RankSpec(0, 2), arch)
    sizes = rank_rehearsal.rollout_sizes(cfg.actor_rollout_ref.rollout)
    assert sizes == rollout_stand_in(arch, 2) == {**sizes, "intermediate_size": 48, "num_attention_heads": 2}
    whole = _adapter(arch)
    engine = SimpleNamespace(model_config=SimpleNamespace(hf_config=AutoConfig.for_model(**arch)))

    def verls(self: Any, layered_summon: bool = False, base_sync_done: bool = False) -> Any:
        return whole.items(), ({"r": 4} if self.peft else None)

    get = rank_rehearsal._make_per_tensor_param(verls, RankSpec(0, 2))
    down = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
    try:
        rank_rehearsal._rollout_sizes.update(sizes)
        for peft, base_sync_done, cols in ((True, True, 48), (True, False, 96), (False, True, 96)):
            engine.peft = peft
            params, _ = get(engine, layered_summon=False, base_sync_done=base_sync_done)
            assert dict(params)[down].shape == (4, cols), (peft, base_sync_done)
        rank_rehearsal._rollout_sizes.clear()
        params, _ = get(engine, False, True)
        assert dict(params)[down].shape == (4, 96)
    finally:
        rank_rehearsal._rollout_sizes.clear()


def test_a_rank_rehearsal_refuses_what_one_gpu_cannot_stand_in_for() -> None:
    pytest.importorskip("verl")
    with pytest.raises(RecipeError, match="does not split over 2 data-parallel ranks"):
        rank_rehearsal.localize(_job(sets=["data.train_batch_size=7"]), RankSpec(0, 2))
    with pytest.raises(RecipeError, match="do not split over rollout TP=3"):
        rollout_stand_in({"num_attention_heads": 40, "intermediate_size": 13824, "hidden_size": 5120}, 3)


def _patched_in_a_fresh_process(rank: str | None) -> dict[str, Any]:
    """What the driver's entry point patches before verl's main runs, in a process of its own."""
    code = (
        "import json, verl_recipes.worker.driver as d, verl_recipes.worker.rank_rehearsal as r\n"
        "spec = r.apply()\n"
        "import verl.utils.distributed as vd, verl.trainer.main_ppo as mp\n"
        "print(json.dumps({'spec': spec and spec.env_value,"
        " 'group': hasattr(vd.initialize_global_process_group_ray, '__wrapped__'),"
        " 'driver': hasattr(mp.run_ppo, '__wrapped__')}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
    env.pop(ENV_RANK, None)
    if rank:
        env[ENV_RANK] = rank
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    return {"rc": proc.returncode, "err": proc.stderr, **(json.loads(proc.stdout) if proc.returncode == 0 else {})}


def test_the_rehearsal_patches_verl_only_where_it_is_asked_for() -> None:
    pytest.importorskip("verl")
    plain = _patched_in_a_fresh_process(None)
    assert (plain["rc"], plain["spec"], plain["group"], plain["driver"]) == (0, None, False, False)
    asked = _patched_in_a_fresh_process("0/2")
    assert (asked["spec"], asked["group"], asked["driver"]) == ("0/2", True, True)
    wrong = _patched_in_a_fresh_process("2/2")
    assert wrong["rc"] != 0 and "--rank 2 is not a rank of this job's 2 GPU(s)" in wrong["err"]


def test_a_non_zero_rank_gets_finite_shards_where_rank_0s_broadcast_sends_nothing() -> None:
    """Under the fake group rank R > 0 receives no broadcast from rank 0: its shards keep whatever
    `to_empty` left (NaN here, on purpose). `fill_unsent` gives them finite values in place, at the
    same local shapes: what the rank holds is unchanged, only what it computes with."""
    pytest.importorskip("verl")
    code = """
import json, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM
from verl_recipes.worker.rank_rehearsal import fill_unsent
dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
mesh = init_device_mesh("cpu", (2,))
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=256)
model = LlamaForCausalLM(cfg)
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
with torch.no_grad():
    for p in model.parameters():
        p.to_local().fill_(float("nan"))
before = [tuple(p.to_local().shape) for p in model.parameters()]
bad = sum(not torch.isfinite(p.to_local()).all() for p in model.parameters())
fill_unsent(model)
after = sum(not torch.isfinite(p.to_local()).all() for p in model.parameters())
shapes = [tuple(p.to_local().shape) for p in model.parameters()]
ids = torch.randint(0, 256, (1, 8))
loss = model(ids, labels=ids).loss
print(json.dumps({"bad_before": int(bad), "bad_after": int(after), "same_shapes": before == shapes,
                  "loss_finite": bool(torch.isfinite(loss))}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["bad_before"] > 0 and got["bad_after"] == 0
    assert got["same_shapes"] and got["loss_finite"]


def test_the_fake_groups_all_gathers_run_outside_autograd_and_a_real_groups_as_they_are() -> None:
    """torch 2.11's fake backend fills an all-gather's output through autograd, which refused
    FSDP1's second adapter sync (its gather buffer carries history after the first summon); NCCL
    fills it outside autograd. The rehearsal's group gathers under no_grad; a gloo group of the
    same process is left as it is. A gather that reads the grad mode it runs under tells."""
    code = """
import json, torch, torch.distributed as dist
from verl_recipes.layout import RankSpec
from verl_recipes.worker.rank_rehearsal import FAKE_GATHERS, init_fake_group, outside_autograd_if_fake
init_fake_group(RankSpec(0, 2))
installed = [getattr(getattr(dist, n), "__wrapped__", None) is not None for n in FAKE_GATHERS]
modes = []
def gather(out, inp, group=None, async_op=False):
    modes.append(torch.is_grad_enabled())
    return dist.distributed_c10d.all_gather_into_tensor(out, inp, group, async_op)
wrapped = outside_autograd_if_fake(gather)
twice = outside_autograd_if_fake(wrapped) is wrapped
buf = torch.zeros(8, requires_grad=True).clone()  # a tensor with autograd history, as FSDP's buffer
with torch.enable_grad():
    wrapped(buf, torch.ones(4))
    dist.all_gather_into_tensor(buf, torch.ones(4))  # the patched name FSDP1 calls
print(json.dumps({"installed": installed, "modes": modes, "twice": twice}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["installed"] == [True, True] and got["twice"]
    assert got["modes"] == [False]  # under the fake group: no grad
    real = """
import json, os, torch, torch.distributed as dist
from verl_recipes.worker.rank_rehearsal import outside_autograd_if_fake
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
modes = []
def gather(out, inp, group=None, async_op=False):
    modes.append(torch.is_grad_enabled())
    return dist.all_gather_into_tensor(out, inp, group, async_op)
with torch.enable_grad():
    outside_autograd_if_fake(gather)(torch.zeros(4), torch.ones(4))
print(json.dumps({"modes": modes}))
"""
    proc = subprocess.run([sys.executable, "-c", real], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["modes"] == [True]  # a real group: as it was


def test_an_object_broadcast_from_an_absent_rank_leaves_the_receivers_objects() -> None:
    """torch's own ``broadcast_object_list`` under the fake group, on a rank that is not the
    source: without the rehearsal it sizes its buffer from a sizes tensor nothing was received
    into (the control: an allocation of garbage size, or garbage unpickled); with it the rank
    keeps its objects, as the fake broadcast keeps its tensors."""
    code = """
import json, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import verl_recipes.worker.rank_rehearsal as r
r.apply()
dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
objs = [{"shape": [3, 4]}]
dist.broadcast_object_list(objs, src=0)
mine = [{"from": "rank 1"}]
dist.broadcast_object_list(mine, src=1)
print(json.dumps({"received": objs, "sent": mine}))
"""

    def run(rank: str | None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
        env.pop(ENV_RANK, None)
        if rank:
            env[ENV_RANK] = rank
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)

    plain = run(None)
    assert plain.returncode != 0 or json.loads(plain.stdout.strip().splitlines()[-1])["received"] != [{"shape": [3, 4]}]
    asked = run("1/2")
    assert asked.returncode == 0, asked.stderr[-2000:]
    got = json.loads(asked.stdout.strip().splitlines()[-1])
    assert got == {"received": [{"shape": [3, 4]}], "sent": [{"from": "rank 1"}]}


def _fsdp_probe() -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
    env.pop(ENV_RANK, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "fsdp_rank_probe.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def test_every_rank_builds_every_fsdp_model_verl_builds() -> None:
    """verl's FSDP model build as rank 0 and rank 1 of two under the fake group: actor, critic and
    reference, LoRA and full, FSDP2 and FSDP1, tied embeddings. Rank 1 receives rank 0's key list
    (it computes it) and runs torch's own broadcast path: its shards are its own 1/2 at the sizes
    rank 0's are, finite, and a forward (and backward) runs; the two ranks together hold each
    FSDP2 model exactly once. The control is rank 1 without that list: verl's load fails with the
    error a GPU host met on the 13B critic. One process builds all 19 (about 15 s: torch,
    transformers, peft and verl import once)."""
    pytest.importorskip("verl")
    pytest.importorskip("peft")
    out = _fsdp_probe()
    views = {(v["case"], v["rank"]): v for v in out if not v["control"]}
    cases = sorted({case for case, _ in views})
    assert len(cases) == 9 and len(views) == 18
    for case in cases:
        r0, r1 = views[(case, 0)], views[(case, 1)]
        for v in (r0, r1):
            assert v["ok"], v
            assert (v["on_meta"], v["nonfinite"], v["finite_forward"]) == (0, 0, True), v
        assert r0["full_numel"] == r1["full_numel"] > 0
        if case.endswith("fsdp1"):
            # flat parameters: each rank holds the same padded half
            assert r0["dtensors"] == 0 and r0["local_numel"] == r1["local_numel"] >= r0["full_numel"] / 2
        else:
            assert r0["dtensors"] == r1["dtensors"] > 0
            assert r0["local_numel"] + r1["local_numel"] == r0["full_numel"], case
    # the value head (one row) lives on rank 0 alone: rank 1's critic is smaller by exactly it
    assert views[("critic-full-fsdp2", 0)]["local_numel"] - views[("critic-full-fsdp2", 1)]["local_numel"] == 65
    (control,) = [v for v in out if v["control"]]
    assert control["rank"] == 1 and not control["ok"]
    assert "got mixed torch.Tensor and DTensor" in control["error"]


def test_a_non_zero_rank_computes_the_key_list_rank_0_sends() -> None:
    """What torch's `_broadcast_state_dict` sends from rank 0 before the tensors, computed from a
    non-zero rank's own meta state: each tensor's size and dtype, a scalar as a CPU value (zero, in
    its dtype, where the rank cannot know it), anything else as it is."""
    torch = pytest.importorskip("torch")
    from torch.distributed._state_dict_utils import _TensorInfo

    meta = {
        "w": torch.empty(4, 3, device="meta", dtype=torch.bfloat16),
        "step": torch.empty((), device="meta", dtype=torch.float32),
        "seen": torch.tensor(7),
        "note": "kept",
    }
    info = rank_rehearsal.rank0_state_info(meta)
    assert info["w"] == _TensorInfo(torch.Size([4, 3]), torch.bfloat16)
    assert info["step"].device.type == "cpu" and info["step"].dtype == torch.float32 and info["step"].item() == 0
    assert info["seen"].item() == 7 and info["note"] == "kept"
