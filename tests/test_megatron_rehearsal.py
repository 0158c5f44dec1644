"""Rank rehearsal on verl's Megatron backend (`verl_recipes.worker.megatron_rehearsal`).

What runs here runs for real: megatron-core's own parallel state and P2P communicator under the
fake group of 32 (when megatron-core imports on this host; CI's Python 3.11 has no 0.19.2 wheel,
so those tests skip and say so), the driver's share on verl's composed 70b-3d config and verl's
own batch-multiple code, verl's dispatch registration, and the patches checked against the pinned
sources they patch. A pipeline step itself needs a GPU (the GPU campaign's).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.layout import ENV_RANK, MegatronLayout, RankSpec, layout_of
from verl_recipes.worker import megatron_rehearsal as mr
from verl_recipes.worker import rank_rehearsal

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_70B = MegatronLayout(32, tp=4, pp=2)


def _mcore() -> Any:
    try:
        import megatron.core.parallel_state as mpu
    except ImportError as e:  # absent, or present without triton (its schedules import it)
        pytest.skip(f"megatron-core does not import here ({e}); 70b-3d's GPU host has it")
    return mpu


def test_the_70b_layout_names_the_first_rank_of_each_pipeline_stage() -> None:
    assert LAYOUT_70B.dp == 4
    assert LAYOUT_70B.coordinates(16) == {"tp": 0, "cp": 0, "dp": 0, "pp": 1}
    assert LAYOUT_70B.coordinates(5) == {"tp": 1, "cp": 0, "dp": 1, "pp": 0}
    assert (LAYOUT_70B.first_rank(0), LAYOUT_70B.first_rank(1)) == (0, 16)
    line = LAYOUT_70B.describe(21)
    assert "TP rank 1, DP rank 1, pipeline stage 1" in line and "--rank 0" in line and "--rank 16" in line
    tp8 = MegatronLayout(32, tp=8, pp=1)
    assert tp8.dp == 4 and "its first rank is --rank 0" in tp8.describe(0)
    with pytest.raises(RecipeError, match=r"32 GPUs \(1 node x 32\) do not divide by TP x PP x CP = 3 x 1 x 1"):
        MegatronLayout(32, tp=3)
    with pytest.raises(RecipeError, match="--rank 32 is not a rank"):
        LAYOUT_70B.coordinates(32)


@pytest.mark.parametrize("tp,pp,cp", [(4, 2, 1), (8, 1, 1), (2, 4, 2), (1, 2, 1)])
def test_rank_coordinates_are_megatron_cores_own(tp: int, pp: int, cp: int) -> None:
    """Against megatron-core's RankGenerator in its default order, every rank of 32."""
    mpu = _mcore()
    layout = MegatronLayout(32, tp=tp, pp=pp, cp=cp)
    gen = mpu.RankGenerator(tp=tp, ep=1, dp=layout.dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    for axis in ("tp", "pp", "dp", "cp"):
        for group in gen.get_ranks(axis):
            for index, rank in enumerate(group):
                assert layout.coordinates(rank)[axis] == index, (axis, rank)
    for stage, group in enumerate(zip(*gen.get_ranks("pp"), strict=True)):
        assert layout.first_rank(stage) == min(group)


def _probe(
    rank_env: str | None, *ranks: int, probe: str = "megatron_rank_probe.py"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "common"), *sys.path])}
    env.pop(ENV_RANK, None)
    if rank_env:
        env[ENV_RANK] = rank_env
    cmd = [sys.executable, str(ROOT / "tests" / "fixtures" / probe), *map(str, ranks)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_megatrons_parallel_state_starts_under_the_fake_group_only_without_gloo() -> None:
    """verl's own call to megatron-core's ``initialize_model_parallel`` under a fake group of 32:
    without the rehearsal's patch it dies making a gloo group (the control), with it each rank
    gets megatron-core's coordinates, the pipeline's shape exchange supplies what the neighbour
    would send, and the optimizer's process groups exist without gloo."""
    _mcore()
    plain = _probe(None, 16)
    assert plain.returncode != 0 and "ProcessGroupGloo" in plain.stderr
    proc = _probe("16/32", 16, 5, 31)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["patched"] and got["optimizer_rebound"]
    for rank in (16, 5, 31):
        c = LAYOUT_70B.coordinates(rank)
        view = got[str(rank)]
        assert (view["tp"], view["pp"], view["dp"], view["cp"], view["gloo"]) == (c["tp"], c["pp"], c["dp"], 0, False)
        assert view["recv_next"] == [96, 1, 64]  # the gradient of the activation sent for it
        assert view["recv_prev"] == [0, 0, 0]  # sized by the model on first use
        # megatron-core's optimizer would ask for the gloo groups the state no longer has; it
        # is built without them (`use_gloo_process_groups=False`) over the DP group of 4
        assert "not initialized" in view["optimizer_with_gloo"] and view["optimizer_dp"] == 4


def test_a_real_stage_1_gpt_model_gets_a_zeroed_activation_of_its_micro_batchs_shape() -> None:
    """megatron-core's GPTModel of pipeline stage 1 (TP4 x PP2 under the fake group of 8), handed
    the empty activation the rehearsal's receive gives: the wrapper of its forward, reading the
    real model's config and decoder, sizes that very object to [seq, batch, hidden] in zeros."""
    _mcore()
    proc = _probe("4/8", probe="megatron_stage_probe.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["stage"], got["pre_process"], got["patched"]) == (1, False, True)
    assert got["received"] == got["decoder_input"] == [24, 2, 64]
    assert got["same_object"] and got["zeros"]


def test_gradients_from_the_next_stage_take_the_shape_of_what_was_sent_in_1f1b_order() -> None:
    import torch

    s = mr.ShapeSupplier()
    a, b = torch.zeros(128, 1, 64), torch.zeros(96, 1, 64)
    # PP2, stage 0: warm-up sends micro-batch 0; steady state sends 1 and receives 0's gradient
    assert s.shapes(a, False, False) == ([0, 0, 0], [0, 0, 0])
    assert s.shapes(b, False, True)[1] == [128, 1, 64]
    assert s.shapes(None, False, True)[1] == [96, 1, 64]  # cool-down: 1's gradient
    with pytest.raises(IndexError):
        s.shapes(None, False, True)  # nothing was sent for a third


def test_the_received_activation_is_sized_to_this_ranks_micro_batch_and_carries_its_gradient() -> None:
    import torch

    # BSHD: position ids [batch 2, seq 300]; TP4 with sequence parallelism splits the sequence
    pos = torch.arange(300).expand(2, 300)
    assert mr.activation_shape(64, 4, True, position_ids=pos) == [75, 2, 64]
    assert mr.activation_shape(64, 4, False, input_ids=pos) == [300, 2, 64]
    # THD: cumulative padded lengths of three sequences, one packed sequence of 96 tokens
    packed = SimpleNamespace(cu_seqlens_q_padded=torch.tensor([0, 32, 64, 96]), cu_seqlens_q=None)
    assert mr.activation_shape(64, 4, True, packed_seq_params=packed) == [24, 1, 64]
    assert mr.activation_shape(64, 1, False, cp=2, packed_seq_params=packed) == [48, 1, 64]

    # what megatron-core's receive gives under the rehearsal: an empty leaf the schedule keeps
    received = torch.empty((0, 0, 0), requires_grad=True, dtype=torch.float32)
    mr.size_placeholder(received, [75, 2, 64])
    assert received.shape == (75, 2, 64) and not received.any() and received.requires_grad
    weight = torch.randn(64, 64, requires_grad=True)
    (received @ weight).sum().backward()
    assert received.grad is not None and received.grad.shape == (75, 2, 64)  # what goes back a stage


def test_receive_buffers_are_zeroed_whatever_the_allocator_left() -> None:
    import torch

    def communicate(self: Any, **kwargs: Any) -> tuple[Any, Any, list[Any]]:
        # megatron-core's torch.empty receive buffers, as garbage as they can be
        return torch.full((4, 1, 8), float("nan"), requires_grad=True), None, []

    prev, nxt, reqs = mr._make_communicate(communicate)(None, recv_prev=True)
    assert prev.shape == (4, 1, 8) and not prev.any() and prev.requires_grad
    assert nxt is None and reqs == []


def test_an_earlier_stage_answers_the_driver_with_the_last_stages_shapes() -> None:
    import torch

    ids = torch.nested.nested_tensor([torch.arange(5), torch.arange(3)], layout=torch.jagged)
    actor = mr.stand_in_outputs(ids, is_value_model=False, entropy=True)
    assert set(actor["model_output"]) == {"log_probs", "entropy"}
    for t in actor["model_output"].values():
        assert [x.shape[0] for x in t.unbind()] == [5, 3] and not t.values().any()
    critic = mr.stand_in_outputs(ids, is_value_model=True)
    assert set(critic["model_output"]) == {"values"} and critic["loss"] == [] and critic["metrics"] == {}


def test_each_schedule_starts_without_stale_shapes_and_an_earlier_stage_answers_with_stand_ins() -> None:
    """The wrapper around verl's ``MegatronEngine.forward_backward_batch``, around a schedule that
    returns what an earlier stage returns ({}) or what the last stage returns, on verl's own
    TensorDict of a batch that asks for entropy."""
    pytest.importorskip("verl")
    import torch
    from verl.utils import tensordict_utils as tu

    ids = torch.nested.nested_tensor([torch.arange(7), torch.arange(4)], layout=torch.jagged)
    data = tu.get_tensordict({"input_ids": ids}, non_tensor_dict={"calculate_entropy": True})
    queued: list[list[list[int]]] = []
    last = {"model_output": {"log_probs": ids.float()}, "loss": [0.5], "metrics": {"m": 1}}

    def schedule(result: dict[str, Any]) -> Any:
        def forward_backward_batch(self: Any, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
            queued.append(list(mr._SUPPLIER.sent))
            mr._SUPPLIER.sent.append([7, 1, 64])  # a forward-only schedule's send, never answered
            return result

        return mr._make_forward_backward_batch(forward_backward_batch)

    engine = SimpleNamespace(is_value_model=False)
    early = schedule({})(engine, data, None, forward_only=True)
    assert set(early["model_output"]) == {"log_probs", "entropy"}
    assert [x.shape[0] for x in early["model_output"]["entropy"].unbind()] == [7, 4]
    assert schedule(last)(engine, data, None) is last  # the last stage's own answer, untouched
    assert queued == [[], []]  # the second schedule did not inherit the first one's send


def test_the_bridge_loads_a_checkpoint_with_weights_and_leaves_megatrons_init_without(tmp_path: Path) -> None:
    """Megatron-Bridge is not on this host: its ``load_hf_weights`` is stood in for by one that
    records the call; the folders are real, one as `synth-model --no-weights` writes it."""
    from verl_recipes.cli import main

    bare, full = tmp_path / "bare", tmp_path / "full"
    assert main(["synth-model", "--arch", "llama-2-7b", "--scale", "tiny", "--no-weights", "--out", str(bare)]) == 0
    assert main(["synth-model", "--arch", "llama-2-7b", "--scale", "tiny", "--out", str(full)]) == 0
    loaded: list[str] = []

    def load_hf_weights(self: Any, model: Any, hf_path: Any = None, **kwargs: Any) -> str:
        loaded.append(Path(hf_path).name)
        return "loaded"

    load = mr._make_load_hf_weights(load_hf_weights)
    assert load(None, [], str(bare), allowed_mismatched_params=[]) is None
    assert load(None, [], str(full), allowed_mismatched_params=[]) == "loaded"
    assert loaded == ["full"] and (mr.has_weights(full), mr.has_weights(bare)) == (True, False)


def _source(module: str) -> tuple[Path, ast.Module] | None:
    """The installed source of `module`, found from its top-level package without importing it
    (importing verl's Megatron engine imports megatron-core); None where it is not installed."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location, *rest[:-1], rest[-1] + ".py")
        if path.is_file():
            return path, ast.parse(path.read_text())
    return None


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    *owner, attr = name.split(".")
    body: list[ast.stmt] = tree.body
    for cls in owner:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return None
        body = node.body
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == attr), None)


def test_every_patch_names_a_function_of_the_pinned_sources() -> None:
    """Each (module, function) the rehearsal patches, read from the installed source without
    importing it (verl's Megatron engine needs megatron-core): the function exists, and verl's
    Megatron engine calls ``initialize_model_parallel`` without the gloo keyword and loads the
    HF weights through the Bridge, which is why two of the patches exist."""
    pytest.importorskip("verl")
    checked = []
    for module, name, _ in mr.PATCHES:
        found = _source(module)
        if found is None:
            continue  # megatron-core / Megatron-Bridge not on this host
        path, tree = found
        fn = _function(tree, name)
        assert fn is not None, f"{path}: no {name}"
        if name == "GPTModel.forward":  # the wrapper names its first three positional arguments
            assert [a.arg for a in fn.args.args[1:4]] == ["input_ids", "position_ids", "attention_mask"]
        if name == "P2PCommunicator._communicate_shapes":  # replaced with the same parameters
            assert [a.arg for a in fn.args.args] == [
                "self",
                "tensor_send_next",
                "tensor_send_prev",
                "recv_prev",
                "recv_next",
            ]
        if name == "P2PCommunicator._communicate":  # wrapped as keyword-only
            assert [a.arg for a in fn.args.args] == ["self"] and fn.args.kwonlyargs
        checked.append(module)
    assert "verl.workers.engine.megatron.transformer_impl" in checked
    path, tree = _source("verl.workers.engine.megatron.transformer_impl") or (None, None)
    assert tree is not None
    calls = {
        ast.unparse(n.func): {k.arg for k in n.keywords}
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    assert "create_gloo_process_groups" not in calls["mpu.initialize_model_parallel"]
    assert "allowed_mismatched_params" in calls["self.bridge.load_hf_weights"]
    # no engine subclass overrides what is patched on the base class
    engines = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("MegatronEngine")]
    assert len(engines) >= 3
    for cls in engines[1:]:
        names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        assert not names & {"forward_backward_batch", "is_mp_src_rank_with_outputs"}, cls.name


def test_the_one_worker_gets_the_ranks_whole_share_and_answers_for_its_pipeline() -> None:
    """verl's own Worker registration, in a fresh process with and without the rehearsal: the
    driver splits a batch into max(DP rank) + 1 parts and collects only from marked workers."""
    pytest.importorskip("verl")
    code = (
        "import json, verl_recipes.worker.rank_rehearsal as r\n"
        "r.apply()\n"
        "from verl.single_controller.base.worker import Worker\n"
        "w = Worker.__new__(Worker)\n"
        "w._Worker__dispatch_dp_rank, w._Worker__collect_dp_rank = {}, {}\n"
        "w._register_dispatch_collect_info('train', 2, False)\n"
        "print(json.dumps(w.get_dispatch_collect()))\n"
    )

    def run(rank: str | None) -> dict[str, Any]:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "common")}
        env.pop(ENV_RANK, None)
        if rank:
            env[ENV_RANK] = rank
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run(None) == {"dispatch_dp_rank": {"train": 2}, "collect_dp_rank": {"train": False}}
    assert run("9/32") == {"dispatch_dp_rank": {"train": 0}, "collect_dp_rank": {"train": True}}


def _job(variants: list[str] | None = None, sets: list[str] | None = None) -> Any:
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    recipe = get_recipe("70b-3d")
    return compose_run(recipe, variants or [], sets or [], gpu_layout(recipe, None))


def _verls_batch_multiple() -> Any:
    import math

    import verl

    path = Path(inspect.getfile(verl)).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    tree = ast.parse(path.read_text())
    fn = _function(tree, "PPOTrainer._get_required_batch_multiple")
    assert fn is not None
    ns: dict[str, Any] = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns["_get_required_batch_multiple"]


@pytest.mark.parametrize(
    "variant,place",
    [(None, "TP rank 0, DP rank 0, pipeline stage 1"), ("tp8pp1", "TP rank 0, DP rank 2, pipeline stage 0")],
)
def test_the_driver_of_a_70b_rank_runs_one_data_parallel_share(variant: str | None, place: str) -> None:
    """TP4 x PP2 (or TP8 x PP1) x DP4 on 32 GPUs: the ranks of one pipeline read the same batch,
    so a rank's share is 1/4 of it, not 1/32; vLLM TP4 becomes one TP1 replica of a TP4 rank."""
    pytest.importorskip("verl")
    from verl_recipes.recipe.start_checks import verl_validate
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    arch = shape_config(resolve_arch("llama-2-70b"))
    cfg = _job([variant] if variant else [])
    verl_validate(cfg, arch)  # verl's own start-up checks pass on the whole job
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.data.train_batch_size) == (4, 8, 32)
    assert rank_rehearsal.data_parallel_size(cfg, 32) == 4
    spec = RankSpec(16, 32)
    lines = rank_rehearsal.share_lines(cfg, spec, arch)
    assert any("rank 16 of " in line and place in line for line in lines), lines
    # verl's own batch multiple on the whole job is lcm(DP, mini-batches) = 32; the rank's is 8
    me = SimpleNamespace(config=cfg, use_critic=True, global_steps=1)
    assert _verls_batch_multiple()(me, 4) == 32
    assert rank_rehearsal._make_batch_multiple(_verls_batch_multiple(), spec)(me, 1) == 8
    changed = rank_rehearsal.localize(cfg, spec, arch)
    assert changed["data.train_batch_size"] == (32, 8)
    assert changed["trainer.nnodes"] == (4, 1) and changed["trainer.n_gpus_per_node"] == (8, 1)
    # Llama-2-70B at vLLM TP4: 64 heads of 128, 8 KV heads, MLP 28672; a TP4 rank holds a quarter
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides == {
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "intermediate_size": 7168,
        "head_dim": 128,
    }


def test_a_megatron_rank_rehearsal_refuses_what_megatron_would() -> None:
    pytest.importorskip("verl")
    spec = RankSpec(0, 32)
    with pytest.raises(RecipeError, match="does not split over 4 data-parallel ranks"):
        rank_rehearsal.localize(_job(sets=["data.train_batch_size=30"]), spec, {})
    with pytest.raises(RecipeError, match="critic's Megatron layout"):
        layout_of(_job(sets=["critic.megatron.tensor_model_parallel_size=8"]), 32)
    with pytest.raises(RecipeError, match="virtual pipeline"):
        layout_of(_job(sets=["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"]), 32)
