"""The memory planner on verl 0.9.1's real Hydra config (no mocks).

Numbers checked here are derived by hand in the test from shapes (parameter counts, bytes per
parameter, KV bytes per token), not copied from the planner's output. verl's config is composed
once per root config and deep-copied per test, because composing takes ~5-40 s on the CI machine.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import verl_recipes.recipe.compose as compose_mod
import yaml
from omegaconf import OmegaConf
from verl_recipes import GIB, RecipeError
from verl_recipes.cli import main
from verl_recipes.fixes import CRITIC_BATCHING_FIX, MERGE_FIX, REPLAY_POLL_FIX
from verl_recipes.plan.cli import load_setup
from verl_recipes.plan.errors import error_rows, main_errors
from verl_recipes.predict.cost import Offer, compute_cost, load_prices, pick_offer
from verl_recipes.predict.gpus import GPU, catalogue, catalogued, parse_gpu
from verl_recipes.predict.inputs import setup_from_config
from verl_recipes.predict.knobs import helpful, path_to_fit
from verl_recipes.predict.model import Arch
from verl_recipes.predict.phases import ALL_GATHER, Constants, plan_gpu
from verl_recipes.recipe.compose import merge_strict, parse_sets
from verl_recipes.recipe.metadata import discover, get_recipe
from verl_recipes.recipe.run_config import compose_run, gpu_layout
from verl_recipes.rundir import SUMMARY_SCHEMA as SCHEMA
from verl_recipes.workload.arch import ARCHS_DIR

MIB = 1024**2


@pytest.fixture(scope="module", autouse=True)
def _compose_once() -> Any:
    """compose_verl is pure; cache it for this module and hand out deep copies."""
    orig = compose_mod.compose_verl
    cache: dict[str, Any] = {}

    def cached(name: str) -> Any:
        if name not in cache:
            cache[name] = orig(name)
        return copy.deepcopy(cache[name])

    mp = pytest.MonkeyPatch()
    mp.setattr(compose_mod, "compose_verl", cached)
    yield
    mp.undo()


def _cfg(sets: list[str], name: str = "ppo_trainer") -> Any:
    """verl's own config with explicit overrides (the recipes' files are not involved)."""
    return merge_strict(compose_mod.compose_verl(name), parse_sets(sets), "test")


# A tiny Llama-style model whose numbers are easy to do by hand.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
# per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + 3*64*128 (MLP) + 2*64 (norms) = 36992
# total: 2 layers + 2 * 100*64 (embedding, lm_head) + 64 (final norm) = 86848
TINY_PARAMS = 2 * (4096 + 2048 + 2048 + 4096 + 24576 + 128) + 2 * 6400 + 64
BASE = [
    "algorithm.adv_estimator=grpo",  # no critic
    "data.train_batch_size=4",
    "data.max_prompt_length=16",
    "data.max_response_length=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.max_model_len=32",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
]


def _term(plan: Any, phase: str, prefix: str) -> int:
    ph = plan.phase(phase)
    assert ph is not None, phase
    hits = [t.bytes for t in ph.terms if t.name.startswith(prefix)]
    assert len(hits) == 1, (prefix, [t.name for t in ph.terms])
    return hits[0]


# ---- architecture numbers ---------------------------------------------------------------------
def test_tiny_param_count_by_hand() -> None:
    assert TINY_PARAMS == 86848
    a = Arch.from_config(TINY)
    assert a.params() == TINY_PARAMS
    # critic: lm_head replaced by a Linear(64, 1) with bias
    assert a.critic_params() == TINY_PARAMS - 6400 + 65
    # LoRA r=4 on all seven projections: r * (in + out) each
    per_layer = 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert a.lora_params(4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")) == (
        2 * per_layer
    )
    # KV cache: 2 (K, V) x 2 layers x 2 KV heads x head_dim 16 x 2 bytes; TP2 halves the heads
    assert a.kv_bytes_per_token(1) == 2 * 2 * 2 * 16 * 2
    assert a.kv_bytes_per_token(2) == 2 * 2 * 1 * 16 * 2
    assert a.kv_bytes_per_token(4) == a.kv_bytes_per_token(2)  # vLLM replicates: at least one head


def test_bundled_archs_match_recipe_param_counts_and_qwen2_0_5b() -> None:
    for rid, r in discover().items():
        assert Arch.from_config(r.arch_config).params() == r.model.params, rid
    # Qwen2-0.5B (tied embeddings, q/k/v biases): 494,032,768 parameters, as its model card states.
    assert Arch.from_file(ARCHS_DIR / "qwen2-0.5b" / "config.json").params() == 494_032_768


def test_llama7b_activation_bytes_by_hand() -> None:
    a = Arch.from_file(ARCHS_DIR / "llama-2-7b" / "config.json")
    h, f = 4096, 11008
    # 16h (norms, inputs) + 4*q + 4*kv + 4*heads (log-sum-exp) + 8f (gated MLP)
    assert a.activation_bytes_per_token_layer() == 16 * h + 4 * h + 4 * h + 4 * 32 + 8 * f == 186_496
    assert a.checkpoint_bytes_per_token_layer() == 2 * h


# ---- per-phase numbers on a real verl config -------------------------------------------------
def test_tiny_fsdp_full_finetune_bytes_by_hand() -> None:
    arch = Arch.from_config(TINY)
    s = setup_from_config(_cfg(BASE), arch)
    assert s.critic is None and s.ref == "none" and s.actor.param_bytes == 4  # verl's fp32 default
    gpu = GPU("t", "t", GIB, GIB)
    p = plan_gpu(s, gpu)
    # update_actor on 1 GPU: fp32 weights, fp32 grads, AdamW exp_avg + exp_avg_sq in fp32
    assert _term(p, "update_actor", "actor weights") == 4 * TINY_PARAMS
    assert _term(p, "update_actor", "actor gradients") == 4 * TINY_PARAMS
    assert _term(p, "update_actor", "actor optimizer") == 8 * TINY_PARAMS
    # no gradients outside the update; no optimizer state before step 1
    assert _term(p, "gen", "actor gradients") == 0
    assert _term(p, "outside", "actor optimizer") == 0
    # logits of the update: micro-batch 2 x 32 tokens x vocab 100 x 10 bytes
    assert _term(p, "update_actor", "actor logits") == 2 * 32 * 100 * 10
    # two GPUs: FSDP shards weights, gradients and moments over both
    s2 = setup_from_config(_cfg([*BASE, "trainer.n_gpus_per_node=2"]), arch)
    p2 = plan_gpu(s2, gpu)
    assert _term(p2, "update_actor", "actor optimizer") == 8 * TINY_PARAMS // 2
    # bf16 model_dtype halves weights and moments
    s3 = setup_from_config(_cfg([*BASE, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]), arch)
    assert _term(plan_gpu(s3, gpu), "update_actor", "actor weights") == 2 * TINY_PARAMS


def test_tiny_adamw_step_temporary_is_one_trainable_shard() -> None:
    """torch's foreach AdamW takes sqrt(exp_avg_sq) of every parameter at once: one more copy of
    the trainable shard during the update (the Qwen2-7B full fine-tunes' allocated peaks)."""
    arch = Arch.from_config(TINY)
    gpu = GPU("t", "t", GIB, GIB)
    p = plan_gpu(setup_from_config(_cfg(BASE), arch), gpu)
    assert _term(p, "update_actor", "actor AdamW step temporary") == 4 * TINY_PARAMS
    assert not any("AdamW step" in t.name for t in p.phase("old_log_prob").terms)  # type: ignore[union-attr]
    p2 = plan_gpu(setup_from_config(_cfg([*BASE, "trainer.n_gpus_per_node=2"]), arch), gpu)
    assert _term(p2, "update_actor", "actor AdamW step temporary") == 4 * TINY_PARAMS // 2
    lora = setup_from_config(_cfg([*BASE, "actor_rollout_ref.model.lora_rank=4"]), arch)
    assert _term(plan_gpu(lora, gpu), "update_actor", "actor AdamW step temporary") == _term(
        plan_gpu(lora, gpu), "update_actor", "actor gradients"
    )
    # FSDP2's offload policy steps on the CPU: nothing of it on the GPU
    policy = [
        *BASE,
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
    ]
    s3 = setup_from_config(_cfg(policy), arch)
    assert s3.actor.offload_policy
    assert _term(plan_gpu(s3, gpu), "update_actor", "actor AdamW step temporary") == 0


def test_tiny_fsdp2_all_gather_buffers_at_a_world_above_one_by_hand() -> None:
    """FSDP2 gathers nothing at a world of 1; above it each root keeps, on streams of its own, the
    largest pair of units gathered one after the other plus the second one's shard (bf16)."""
    arch = Arch.from_config(TINY)
    gpu = GPU("t", "t", GIB, GIB)
    fsdp2 = [*BASE, "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2"]
    ppo = [
        *fsdp2,
        "algorithm.adv_estimator=gae",
        "critic.strategy=fsdp2",
        "critic.fsdp.strategy=fsdp2",
        "critic.ppo_micro_batch_size_per_gpu=2",
    ]
    layer = 36992
    # units in forward order: root (final norm, 64), embedding (6400), two layers, lm_head (6400);
    # the largest pair is two layers: 2 x 36992 + 36992 / 2, in bf16
    actor = 2 * (2 * layer + layer // 2)
    # the critic's root holds the final norm and the Linear(64, 1) score head; its pair is the same
    one = plan_gpu(setup_from_config(_cfg(ppo), arch), gpu)
    two = plan_gpu(setup_from_config(_cfg([*ppo, "trainer.n_gpus_per_node=2"]), arch), gpu)
    for ph in one.phases:
        assert not any("all-gather" in t.name for t in ph.terms), ph.phase
    assert _term(two, "old_log_prob", "actor FSDP2 all-gather buffers (own") == actor
    assert not any("critic" in t.name and "all-gather" in t.name for t in two.phase("old_log_prob").terms)  # type: ignore[union-attr]
    # the actor's stay reserved once the critic computes, and the critic adds its own
    assert _term(two, "values", "actor FSDP2 all-gather buffers, cached since old_log_prob") == actor
    assert _term(two, "values", "critic FSDP2 all-gather buffers (own") == actor
    assert _term(two, "update_actor", "critic FSDP2 all-gather buffers, cached since values") == actor
    for ph in ("outside", "update_weights", "gen"):  # verl empties the cache at the sync
        assert not any("all-gather" in t.name for t in two.phase(ph).terms), ph  # type: ignore[union-attr]
    # a world of 4 gathers a quarter shard
    four = plan_gpu(setup_from_config(_cfg([*ppo, "trainer.n_gpus_per_node=4"]), arch), gpu)
    assert _term(four, "old_log_prob", "actor FSDP2 all-gather buffers (own") == 2 * (2 * layer + layer // 4)
    # FSDP1 is another code path: no term
    fsdp1 = plan_gpu(setup_from_config(_cfg([*BASE, "trainer.n_gpus_per_node=2"]), arch), gpu)
    assert not any("all-gather" in t.name for ph in fsdp1.phases for t in ph.terms)
    # an offload that empties the cache as the role leaves its phase takes the buffers with it
    legacy = [*ppo, "trainer.n_gpus_per_node=2", "critic.fsdp.param_offload=true"]
    off = plan_gpu(setup_from_config(_cfg(legacy), arch), gpu)
    assert not any("critic" in t.name and "all-gather" in t.name for t in off.phase("update_actor").terms)  # type: ignore[union-attr]


def test_tiny_fsdp2_gradients_come_on_top_of_the_cache_and_stay_on_their_stream() -> None:
    """FSDP2's sharded gradients live on the role's reduce-scatter stream, which the compute
    stream's cache cannot serve: an update holds the larger of its other terms and what the phases
    before left cached, plus its gradients, and the critic's stay cached into the actor's update."""
    arch = Arch.from_config({**TINY, "vocab_size": 20000})  # logits that outweigh the critic's update
    gpu = GPU("t", "t", GIB, GIB)
    ppo = [
        *BASE,
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "algorithm.adv_estimator=gae",
        "critic.strategy=fsdp2",
        "critic.fsdp.strategy=fsdp2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        # a long forward micro-batch, so old_log_prob leaves more cache than the critic's update needs
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.model.use_remove_padding=false",  # the padded forward's 14 B logits
    ]
    for world in (1, 2):
        p = plan_gpu(setup_from_config(_cfg([*ppo, f"trainer.n_gpus_per_node={world}"]), arch), gpu)
        critic_grads = _term(p, "update_critic", "critic gradients (fp32, on FSDP2's reduce-scatter stream)")
        actor_grads = _term(p, "update_actor", "actor gradients (fp32, on FSDP2's reduce-scatter stream)")
        assert critic_grads > 0 and actor_grads > 0
        # the forward phases left more cache than the critic's update needs besides its gradients:
        # the update holds that cache and its gradients on top
        critic_update, values = p.phase("update_critic"), p.phase("values")
        assert critic_update is not None and values is not None
        assert _term(p, "update_critic", "trainer cache left by") > 0
        assert critic_update.by_process()["trainer"] == values.by_process()["trainer"] + critic_grads
        # the critic's gradients, freed after its update, stay cached on its stream
        assert _term(p, "update_actor", "critic gradients cached on FSDP2's reduce-scatter stream") == critic_grads
        assert not any("cached on FSDP2's reduce-scatter" in t.name for t in p.phase("values").terms)  # type: ignore[union-attr]


def test_a_run_is_judged_at_the_longest_sequence_it_logged(tmp_path: Path) -> None:
    """verl pads a micro-batch to its longest sequence and cuts a dynamic batch into as many
    micro-batches as its tokens need: 8 rows of 1075 tokens at a budget of 8192 are two of 4 x 1075,
    not the bound's 8192."""
    from dataclasses import replace

    from verl_recipes.plan.runs import MeasuredRun
    from verl_recipes.predict.phases import _tokens

    _, s, _ = load_setup("13b-fsdp", [], [])
    assert s.world == 2 and s.actor.dynamic_bsz and s.seq_len == 2048
    assert _tokens(s, s.actor, True) == 8192  # the bound: 4 rows (8 over 2 GPUs) of 2048
    one = replace(s, nnodes=1, gpus_per_node=1)
    assert _tokens(one, one.actor, True) == 8192  # 8 rows of 2048 in two micro-batches of 4
    judged = replace(one, logged_seq_len=1075)
    assert judged.train_seq_len == 1075 and _tokens(judged, judged.actor, True) == 4 * 1075
    assert replace(one, logged_seq_len=4096).train_seq_len == 2048  # never above the bound
    # the run's longest: the longest prompt plus the longest response, of its longest step
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [
        {"step": 1, "data": {"prompt_length/max": 49.0, "response_length/max": 1024.0}},
        {"step": 2, "data": {"prompt_length/max": 51.0, "response_length/max": 1000.0}},
    ]
    (run_dir / "verl_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = MeasuredRun(run_dir / "summary.json", "13b-fsdp", {}, "", {})
    assert run.longest_sequence == 49 + 1024  # a micro-batch holds one step's sequences
    (run_dir / "verl_metrics.jsonl").write_text("")
    assert run.longest_sequence is None  # a run that logged no step is judged at the bound


def test_a_run_of_one_step_is_judged_as_its_first_step(root: Path, tmp_path: Path) -> None:
    """torch's AdamW makes its moments at the first optimizer.step(): the Qwen2-7B rank of 8 that
    ran one step held none in gen, old_log_prob and ref, and its update peaked without them (60.43
    GiB against 67.40 planned with them, 60.31 without). A run of one step is planned as its
    first step (`Setup.first_step`); the sync after the update, and every phase of a longer run,
    hold the moments as the steady state does."""
    from dataclasses import replace

    from verl_recipes.plan.runs import MeasuredRun, judged_setup, read_run

    arch = Arch.from_config(TINY)
    gpu = GPU("t", "t", GIB, GIB)
    critic = [*BASE, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2"]
    steady = setup_from_config(_cfg(critic), arch)
    first = replace(steady, first_step=True)
    ps, pf = plan_gpu(steady, gpu), plan_gpu(first, gpu)
    moments = 8 * TINY_PARAMS  # exp_avg and exp_avg_sq, fp32, of the actor's weights
    critic_moments = _term(ps, "update_critic", "critic optimizer")
    for phase in ("gen", "old_log_prob", "values"):
        assert _term(pf, phase, "actor optimizer") == 0 and _term(ps, phase, "actor optimizer") == moments
        assert _term(pf, phase, "critic optimizer") == 0 < _term(ps, phase, "critic optimizer")
    # the critic's update comes before the actor's: its moments are made there, the actor's later
    assert _term(pf, "update_actor", "critic optimizer") == critic_moments
    # the step's sync follows the update: both roles' moments, as in the steady state
    assert pf.phase("update_weights").total == ps.phase("update_weights").total  # type: ignore[union-attr]
    # the first update: its forward and backward without the moments, or the step with them and
    # the AdamW temporary, whichever is larger; the steady state holds both at once
    upd = pf.phase("update_actor")
    assert upd is not None
    names = [t.name for t in upd.terms]
    without = ps.phase("update_actor").total - moments  # type: ignore[union-attr]
    step = sum(t.bytes for t in ps.phase("update_actor").terms) - sum(  # type: ignore[union-attr]
        _term(ps, "update_actor", p)
        for p in ("actor activations", "actor logits", "actor unsharded fp32", "actor FSDP unsharded")
    )
    assert upd.total == max(without, step), names
    assert ps.phase("update_actor").total > upd.total  # type: ignore[union-attr]
    # Megatron's optimizer is not judged by it
    mf, ms = (plan_gpu(replace(x, actor=replace(x.actor, backend="megatron")), gpu) for x in (first, steady))
    assert _term(mf, "gen", "actor optimizer") == _term(ms, "gen", "actor optimizer") > 0
    # which runs: the committed Qwen2-7B rank (one step) and the quickstart's whole run (two)
    examples = root / "validation" / "verl-examples" / "results"
    one = read_run(examples / "grpo-qwen2-7b-seq-balance" / "h100x1-grpo-rank0of8")
    two = read_run(examples / "gsm8k-quickstart" / "h100x1-ppo")
    assert (one.steps_run, judged_setup(one).first_step) == (1, True)
    assert (two.steps_run, judged_setup(two).first_step) == (2, False)
    assert MeasuredRun(tmp_path / "summary.json", "", {}, "", {}).steps_run == 0


def test_tiny_lora_optimizer_only_for_adapters() -> None:
    arch = Arch.from_config(TINY)
    s = setup_from_config(_cfg([*BASE, "actor_rollout_ref.model.lora_rank=4"]), arch)
    p = plan_gpu(s, GPU("t", "t", GIB, GIB))
    lora = 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert _term(p, "update_actor", "actor weights") == 4 * (TINY_PARAMS + lora)
    assert _term(p, "update_actor", "actor optimizer") == 8 * lora
    assert _term(p, "update_actor", "actor gradients") == 4 * lora


def test_tiny_vllm_kv_cache_by_hand() -> None:
    arch = Arch.from_config(TINY)
    sets = [*BASE, "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"]
    sets += [
        "actor_rollout_ref.rollout.max_num_batched_tokens=64",
        "actor_rollout_ref.rollout.max_num_seqs=4",
    ]
    s = setup_from_config(_cfg(sets), arch)
    p = plan_gpu(s, GPU("t", "t", GIB, GIB))
    weights = 2 * TINY_PARAMS  # bf16, TP1
    # profile run: 64 tokens through one layer (2*2h + 4h + max(3*2f, 2*(2q + 2kv))) + sampler 4 x V x 8
    act = 64 * (4 * 64 + 4 * 64 + max(6 * 128, 2 * (2 * 64 + 2 * 32))) + 4 * 100 * 8
    kv = GIB // 2 - weights - act - Constants().vllm_nontorch_bytes
    assert p.kv_bytes == kv
    assert p.kv_tokens == kv // (2 * 2 * 2 * 16 * 2)


def test_vllm_start_needs_only_the_window_of_a_sliding_layer() -> None:
    """One max_model_len sequence must fit the KV cache (vLLM's start-up check); Mistral v0.1's
    windowed layers hold window - 1 + max_num_batched_tokens of it, not all 32,768 tokens."""
    arch = Arch.from_file(ARCHS_DIR / "mistral-7b-v0.1" / "config.json")
    sets = [*BASE[:-3], "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
    sets += ["actor_rollout_ref.rollout.max_num_batched_tokens=4096", "actor_rollout_ref.rollout.max_model_len=32768"]
    p = plan_gpu(setup_from_config(_cfg(sets), arch), catalogue()["h100-80g"])
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert p.kv_needed_bytes == per_token * (4096 - 1 + 4096) < per_token * 32768
    assert not [x for x in p.problems if "max_model_len" in x]


def test_plan_a_deltas_file_with_a_bundled_arch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deltas = tmp_path / "my.yaml"
    deltas.write_text(
        yaml.safe_dump(
            {
                "algorithm": {"adv_estimator": "grpo"},
                "data": {"train_batch_size": 8, "max_prompt_length": 256, "max_response_length": 256},
                "actor_rollout_ref": {
                    "actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2},
                    "rollout": {"log_prob_micro_batch_size_per_gpu": 2, "tensor_model_parallel_size": 1},
                },
                "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
            }
        )
    )
    assert main(["plan", str(deltas), "--arch", "qwen3-8b", "--gpu", "h200-141g", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["params"] == 8_190_735_360  # Qwen3-8B with its q/k norms (tests/test_arch.py)


def test_megatron_70b_stage_weights_by_hand() -> None:
    arch = Arch.from_file(ARCHS_DIR / "llama-2-70b" / "config.json")
    sets = [
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=32",
        "data.max_prompt_length=2048",
        "data.max_response_length=2048",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=4",
    ]
    s = setup_from_config(_cfg(sets, "ppo_megatron_trainer"), arch)
    assert s.backend == "megatron" and s.dp(s.actor) == 4
    p = plan_gpu(s, catalogue()["h100-80g"])
    h, q, kv, f = 8192, 8192, 1024, 28672
    layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
    assert layer == 855_654_400
    last_stage = 40 * layer + 32000 * h + h  # 40 layers + output layer + final norm
    assert _term(p, "update_actor", "actor weights") == last_stage * 2 // 4  # bf16 / TP4
    assert _term(p, "update_actor", "actor fp32 main-grad buffer") == last_stage * 4 // 4
    assert _term(p, "update_actor", "actor optimizer") == last_stage * 12 // 4 // 4  # distributed over DP4


# ---- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (
            {"model_type": "bert", "architectures": ["BertForMaskedLM"], "num_hidden_layers": 12},
            "decoder-only",
        ),
        ({"model_type": "t5", "is_encoder_decoder": True, "num_layers": 6}, "decoder-only"),
        ({k: v for k, v in TINY.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        ({**TINY, "architectures": ["LlamaForSequenceClassification"]}, "ForCausalLM"),
        ({**TINY, "num_local_experts": 8}, "mixture-of-experts"),
    ],
)
def test_not_a_decoder_lm_fails_with_reason(cfg: dict[str, Any], needle: str) -> None:
    with pytest.raises(RecipeError, match=needle):
        Arch.from_config(cfg)


RTP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MTP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
MPP = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
GPUS = "trainer.n_gpus_per_node"


@pytest.mark.parametrize(
    ("arch", "root", "sets", "needle"),
    [
        ("llama-2-7b", "ppo_trainer", [f"{RTP}=3"], "size=3 does not divide num_attention_heads=32"),
        ("qwen2-7b", "ppo_trainer", [f"{RTP}=7", f"{GPUS}=7"], "num_key_value_heads=4"),
        ("llama-2-7b", "ppo_trainer", [f"{GPUS}=6", f"{RTP}=4"], "do not divide by the rollout"),
        ("llama-2-70b", "ppo_megatron_trainer", [f"{MPP}=3", f"{GPUS}=3"],
         "pipeline_model_parallel_size=3 does not divide num_hidden_layers=80"),
        ("qwen2-7b", "ppo_megatron_trainer", [f"{MTP}=7", f"{GPUS}=7"], "not divide num_key_value_heads=4"),
        ("llama-2-70b", "ppo_megatron_trainer", [f"{MTP}=4", f"{MPP}=2", f"{GPUS}=4"], "by actor TP x PP x CP"),
    ],
)  # fmt: skip
def test_layout_that_does_not_divide_fails(arch: str, root: str, sets: list[str], needle: str) -> None:
    a = Arch.from_file(ARCHS_DIR / arch / "config.json")
    base = [x.replace("data.train_batch_size=4", "data.train_batch_size=168") for x in BASE]
    with pytest.raises(RecipeError, match=needle):
        setup_from_config(_cfg([*base, "actor_rollout_ref.rollout.max_model_len=null", *sets], root), a)


def test_missing_micro_batch_names_the_key() -> None:
    sets = [x for x in BASE if "ppo_micro_batch_size_per_gpu" not in x]
    with pytest.raises(RecipeError, match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu"):
        setup_from_config(_cfg(sets), Arch.from_config(TINY))


def test_verl_batch_checks() -> None:
    with pytest.raises(RecipeError, match="ppo_mini_batch_size"):
        setup_from_config(_cfg([*BASE, "actor_rollout_ref.actor.ppo_mini_batch_size=8"]), Arch.from_config(TINY))


# ---- the recipes ------------------------------------------------------------------------------
@pytest.mark.parametrize("rid", sorted(discover()))
def test_every_recipe_and_variant_plans(rid: str) -> None:
    recipe = get_recipe(rid)
    for variants in [[], *([v] for v in recipe.variants)]:
        label, s, _ = load_setup(rid, variants, [])
        assert s.world == recipe.gpus.count, label
        for g in catalogue().values():
            p = plan_gpu(s, g)
            assert all(ph.total > 0 for ph in p.phases)
            assert {"outside", "update_weights", "gen", "old_log_prob", "update_actor"} <= {ph.phase for ph in p.phases}
            assert ("values" in {ph.phase for ph in p.phases}) == (s.critic is not None)


def test_7b_lora_reference_and_critic_follow_verl_rules() -> None:
    _, ppo, _ = load_setup("7b-lora", [], [])
    assert ppo.critic is not None and ppo.ref == "none"  # gae: critic; no KL: no reference
    _, grpo, _ = load_setup("7b-lora", ["grpo"], ["actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    assert grpo.critic is None and grpo.ref == "in_actor"  # KL loss + LoRA: the actor without adapter
    _, full, _ = load_setup(
        "7b-lora",
        ["grpo"],
        ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.model.lora_rank=0"],
    )
    assert full.ref == "separate"


def test_vllm_cannot_start_when_the_trainer_holds_too_much() -> None:
    # 7B LoRA with bf16 actor and critic resident (~25.5 GiB) on a 40 GiB A100 at utilization 0.9
    _, s, _ = load_setup("7b-lora", [], ["actor_rollout_ref.rollout.gpu_memory_utilization=0.9"])
    p = plan_gpu(s, catalogue()["a100-40g"])
    assert any(x.startswith("vLLM cannot start") for x in p.problems)


def test_sync_bucket_smaller_than_a_weight_fails() -> None:
    bucket = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=100"
    _, s, _ = load_setup("7b-lora", [], [bucket])
    p = plan_gpu(s, catalogue()["h200-141g"])
    assert any("update_weights_bucket_megabytes=100" in x for x in p.problems)  # embedding is 250 MiB


def test_knob_suggestion_changes_the_verdict_on_the_real_config() -> None:
    """The --set lines the planner proposes, applied to verl's config, make the plan fit."""
    gpu = parse_gpu("a10g-24g")
    _, s, _ = load_setup("7b-lora", [], [])  # the H200 settings: vLLM at 0.3 of the card, no offload
    assert not plan_gpu(s, gpu).fits
    best = helpful(s, gpu)[0]
    assert best.saves > 0
    path = path_to_fit(s, gpu, more_gpus=False)
    assert path, "a one-GPU fix exists for 7B LoRA on 24 GB (FSDP2 CPU offload_policy + vLLM budget)"
    sets = [x for st in path for x in st.knob.sets]
    _, fixed, _ = load_setup("7b-lora", [], sets)
    assert fixed.world == 1
    assert plan_gpu(fixed, gpu).fits


def test_more_gpus_knob_shards_fsdp_state() -> None:
    _, s, _ = load_setup("verl-vs-deepspeed", [], [])
    gpu = catalogue()["a100-80g"]
    base = plan_gpu(s, gpu)
    more = next(sg for sg in helpful(s, gpu) if sg.knob.name.endswith("GPUs"))
    assert more.knob.sets == ("trainer.n_gpus_per_node=4",)
    after, before = more.plan.phase("update_actor"), base.phase("update_actor")
    assert after is not None and before is not None and after.total < before.total


# ---- GPUs, cost, CLI, errors ------------------------------------------------------------------
def test_gpu_catalogue_and_caps() -> None:
    cat = catalogue()
    assert set(cat) == {"a10g-24g", "l4-24g", "a100-40g", "a100-80g", "h100-80g", "h200-141g"}
    assert cat["a100-80g"].visible_bytes == 80 * GIB
    assert cat["a10g-24g"].visible_bytes == 24 * GIB * 15 // 16  # GDDR6 in-band ECC
    assert cat["h200-141g"].visible_bytes == 143771 * MIB  # nvidia-smi on our H200 (host.txt)
    assert parse_gpu("24GiB").visible_bytes == 24 * GIB
    assert parse_gpu("24GB").visible_bytes == 24 * 10**9
    with pytest.raises(RecipeError, match="not a catalogue GPU"):
        parse_gpu("v100")
    assert parse_gpu("a10g") == cat["a10g-24g"]  # a prefix that names one card
    with pytest.raises(RecipeError, match="not a catalogue GPU"):
        parse_gpu("a100")  # two cards: say which


def test_every_committed_run_names_a_catalogued_card(root: Path) -> None:
    """A run is matched to its card by NVML's name (its measured peak judges that card, its rate
    prices it): each committed run's device must be one catalogue entry, and where the entry says
    what CUDA shows (visible_bytes) the run's device showed exactly that."""
    seen = set()
    for prov in sorted(root.glob("recipes/*/results/*/provenance.json")):
        for dev in json.loads(prov.read_text())["gpu"]["gpus"]:
            card = catalogued(dev["name"])
            assert card is not None, f"{prov}: {dev['name']!r} is in no catalogue entry's nvml_names"
            if card.visible_bytes != card.memory_bytes:  # a visible size taken from a host record
                assert dev["memory_total_bytes"] == card.visible_bytes, prov
            seen.add(card.id)
    assert {"h200-141g", "h100-80g"} <= seen
    assert catalogued("NVIDIA H100 PCIe") is None  # another card of the same memory: not the SXM entry
    assert not catalogue()["h200-141g"].runs_as("NVIDIA H200 NVL")


def test_cost_by_hand_and_prices_file(root: Path, tmp_path: Path) -> None:
    o = Offer("x", "P", "p", 2.0, "2026-01-01", "https://example.com")
    c = compute_cost(o, gpus=2, tokens_per_s=1000.0, tokens_per_step=8000)
    assert c.gpu_hours_per_million_tokens == pytest.approx(2 * 1000 / 3600)
    assert c.usd_per_million_tokens == pytest.approx(2 * 1000 / 3600 * 2.0)
    assert c.step_seconds == pytest.approx(8.0)
    assert c.usd_per_step == pytest.approx(2 * 8 / 3600 * 2.0)
    offers = load_prices(root / "validation" / "prices.yaml")
    assert "l4-24g" not in offers  # no sourced price found: left out, not guessed
    for lst in offers.values():
        for off in lst:
            assert off.source.startswith("https://") and off.date[:2] == "20"
    cheapest = pick_offer(offers, "h100-80g")
    assert cheapest is not None and all(cheapest.usd_per_gpu_hour <= x.usd_per_gpu_hour for x in offers["h100-80g"])
    bad = tmp_path / "prices.yaml"
    bad.write_text(yaml.safe_dump({"a100-80g": [{"provider": "X", "usd_per_gpu_hour": 1.0, "date": "2026-01-01"}]}))
    with pytest.raises(RecipeError, match="source"):
        load_prices(bad)


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    # a gate: one --gpu it does not fit makes the exit status 1, with the JSON still printed
    assert main(["plan", "7b-lora", "--gpu", "a10g-24g", "--gpu", "h200-141g", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    by = {g["gpu"]["id"]: g for g in out["gpus"]}
    assert by["h200-141g"]["fits"] and not by["a10g-24g"]["fits"]
    assert by["a10g-24g"]["path_to_fit"] and by["a10g-24g"]["best_knob"]["sets"]
    assert all(k["host_bytes"] > 0 for k in [by["a10g-24g"]["best_knob"], *by["a10g-24g"]["path_to_fit"]])
    fit = by["a10g-24g"]["variants_that_fit"]
    assert fit and fit[0]["variants"] == ["24gib"] and fit[0]["host_bytes"] > 0
    assert out["model"]["params"] == 6738415616
    host = out["host"]  # the host RAM of node 0, labelled as a prediction
    assert host["predicted"] is True and host["peak_pss_bytes"] <= host["peak_rss_bytes"]
    assert not host["cpu_backup_sync"] and host["merged_sync_backup_bytes"] == 2 * 6738415616
    assert main(["plan", "7b-lora", "--gpu", "h200-141g", "--tokens-per-s", "2000"]) == 0
    text = capsys.readouterr().out
    assert "update_actor" in text and "dominant terms" in text and "/step" in text
    assert "host RAM of node 0, PREDICTED" in text and "peak: about" in text
    assert main(["plan", "7b-lora", "--gpu", "h200-141g", "--verl-fix-off", MERGE_FIX]) == 0
    assert "verl's merged LoRA sync copies the base weights to the CPU (12.6 GiB)" in capsys.readouterr().out
    assert main(["plan", "7b-lora", "--gpu", "v100"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad_fix:  # a fix's name mistyped: one line naming the fixes
        main(["plan", "7b-lora", "--verl-fix-off", "lora-layered-summon"])
    err = capsys.readouterr().err.strip()
    assert bad_fix.value.code == 2 and len(err.splitlines()) == 1 and "lora-layered-summon-fsdp1" in err


def _fake_run(root: Path, scale: float) -> None:
    """A committed run in the report's schema whose peaks are the planner's own prediction x scale."""
    run = root / "recipes" / "7b-lora" / "results" / "h200-fake"
    run.mkdir(parents=True)
    recipe = get_recipe("7b-lora")
    cfg = compose_run(recipe, [], [], gpu_layout(recipe))
    OmegaConf.save(cfg, run / "verl_config.yaml")
    gpu = catalogue()["h200-141g"]
    _, s, _ = load_setup("7b-lora", [], [])
    plan = plan_gpu(s, gpu, Constants())
    names: dict[str, str] = {}
    sync = plan.phase("update_weights")
    assert sync is not None

    def total(ph: Any) -> int:  # `plan --errors` compares `outside` with the larger of outside and the first sync
        return max(ph.total, sync.total) if ph.phase == "outside" else ph.total

    phases = {
        names.get(ph.phase, ph.phase): {"gpu": {"0": {"used_gib": total(ph) * scale / GIB, "by_class_gib": {}}}}
        for ph in plan.phases
    }
    summary = {
        "schema": SCHEMA,
        "gpus": [{"index": 0, "name": "NVIDIA H200", "total_gib": gpu.visible_bytes / GIB}],
        "phases": {**phases, "step": {"gpu": {"0": {"used_gib": 1.0}}}},
        "steps": [{"step": 1, "throughput": 100.0}, {"step": 2, "throughput": 300.0}],
    }
    (run / "summary.json").write_text(json.dumps(summary))


def test_plan_errors_runs_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --errors` runs the planner's check against the committed runs (`--validate` is no flag)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "versions.toml").write_text("")  # a checkout with no recipe and no run
    monkeypatch.setenv("VERL_RECIPES_ROOT", str(tmp_path))
    assert main(["plan", "--errors", "--allow-empty"]) == 0
    assert "no measured runs found" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's one `error:` line
        main(["plan", "--validate"])
    assert e.value.code == 2


def test_errors_empty_fails_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "recipes").mkdir()
    assert main_errors(root=tmp_path) == 1
    assert "no measured runs found" in capsys.readouterr().out
    assert main_errors(root=tmp_path, allow_empty=True) == 0


@pytest.mark.parametrize(("scale", "ok"), [(1.0, True), (1.05, True), (1.5, False)])
def test_errors_against_a_committed_run(tmp_path: Path, scale: float, ok: bool) -> None:
    _fake_run(tmp_path, scale)
    rows, passed = error_rows(tmp_path, tolerance=0.10)
    assert passed is ok
    assert {r.phase for r in rows} >= {"outside", "gen", "update_actor", "update_critic"}
    assert "step" not in {r.phase for r in rows}
    assert all(r.error == pytest.approx(1 / scale - 1, abs=1e-3) for r in rows)
    assert main_errors(root=tmp_path) == (0 if ok else 1)


def test_a_committed_deepspeed_run_is_never_held_against_verls_planner(root: Path, tmp_path: Path) -> None:
    """The DeepSpeed side of verl-vs-deepspeed has a summary like a verl run's, but no verl config
    to re-plan and another framework's memory: `plan --errors` and every reader of the committed
    runs leave it out (its provenance says `backend: deepspeed`), and still check the verl runs."""
    import shutil

    from verl_recipes.plan.runs import committed_runs, read_run, run_setup

    _fake_run(tmp_path, 1.0)
    src = get_recipe("verl-vs-deepspeed").dir / "results" / "h200x1-ppo-rank0of4-deepspeed"
    ds = tmp_path / "recipes" / "verl-vs-deepspeed" / "results" / src.name
    shutil.copytree(src, ds)
    with pytest.raises(RecipeError, match=r"no verl_config\.yaml"):  # what reading it as verl's would do
        run_setup(read_run(ds))
    assert [r.run_dir.name for r in committed_runs(tmp_path)] == ["h200-fake"]
    rows, ok = error_rows(tmp_path, tolerance=0.10)
    assert ok and rows and {r.run for r in rows} == {"recipes/7b-lora/results/h200-fake"}
    here = committed_runs(root, "verl-vs-deepspeed")  # the checkout's: verl's side only
    assert here and not [r for r in here if r.run_dir.name.endswith("-deepspeed") or not r.provenance.verl]


def test_committed_error_table_is_fresh(root: Path) -> None:
    """validation/planner-errors.md is what `plan --errors --write` gives on the committed runs,
    and every error beyond the tolerance carries a cause or says that it has none yet."""
    from verl_recipes.plan.errors import load_notes, markdown_table
    from verl_recipes.plan.host_runs import host_rows
    from verl_recipes.plan.host_runs import markdown as host_markdown

    rows, _ = error_rows(root, tolerance=0.10)
    notes = load_notes(root)
    table = markdown_table(rows, 0.10, notes)
    host = host_markdown(host_rows(root), 0.10, notes)
    committed = (root / "validation" / "planner-errors.md").read_text()
    assert committed.endswith(table + "\n" + host), (
        "run `verl-recipes plan --errors --write validation/planner-errors.md`"
    )
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and abs(float(cells[5].rstrip("%"))) > 10:
            assert cells[6], line
    for line in host.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[0].startswith("recipes/"):
            worst = max(abs(float(c.rstrip("%"))) for c in (cells[5], cells[8]) if c)
            assert worst <= 10 or cells[9], line


def test_the_critic_takes_its_whole_batch_as_verl_0_9_1_runs_it_unless_fixed() -> None:
    """verl 0.9.1's engine path gives the critic's engine a token budget only (32768), never its
    micro-batch size: the critic of the 7B profile ran one micro-batch of 8 sequences where the
    config said 2. Without the fix critic-engine-batching the planner counts 8 x 1024 tokens of
    critic activations whatever that key says, and says the key has no effect; with it (the
    default), the key counts. A dynamic budget never counts more than the batch holds."""
    fix = CRITIC_BATCHING_FIX
    _, ours, _ = load_setup("7b-lora", [], ["critic.ppo_micro_batch_size_per_gpu=1"])
    _, theirs, _ = load_setup("7b-lora", [], ["critic.ppo_micro_batch_size_per_gpu=1"], fixes_off=[fix])
    assert theirs.critic is not None and theirs.critic.dynamic_bsz and theirs.critic.max_tokens_train == 32768
    a = theirs.arch
    per_token = a.layers * a.checkpoint_bytes_per_token_layer() + a.activation_bytes_per_token_layer()
    for s, tokens in ((theirs, 8192), (ours, 1024)):
        terms = plan_gpu(s, parse_gpu("h200-141g")).phase("update_critic").terms  # type: ignore[union-attr]
        act = [t for t in terms if t.name.startswith("critic activations")]
        assert len(act) == 1 and f"({tokens} tokens" in act[0].name and act[0].bytes == tokens * per_token, act
    assert any(fix in n and "no effect" in n for n in theirs.notes), theirs.notes
    assert not any(fix in n for n in ours.notes)


def _trainer(plan: Any, phase: str, carried: bool) -> int:
    """The trainer process's bytes on the compute stream in `phase`, with or without the cache
    carried from earlier phases (FSDP2's all-gather buffers, on streams of their own, left out)."""
    ph = plan.phase(phase)
    assert ph is not None, phase
    keep = [t for t in ph.terms if (carried or not t.name.startswith("trainer cache")) and ALL_GATHER not in t.name]
    return sum(t.bytes for t in keep if t.process == "trainer")


def test_cache_floor_carries_between_phases_unless_verl_empties_it() -> None:
    """Actor and critic share the trainer process. Under FSDP2's offload policy verl never calls
    empty_cache between old_log_prob and the updates, so each phase holds at least what the one
    before reserved: the critic's forward is priced at no less than the actor's old_log_prob.
    With the legacy param_offload (offload_fsdp_model_to_cpu empties the cache as each phase
    ends) nothing carries, and values is priced on its own terms."""
    gpu = parse_gpu("h200-141g")
    _, policy, _ = load_setup("13b-fsdp", ["32gib"], [])
    assert policy.critic is not None and policy.critic.offload_policy
    p = plan_gpu(policy, gpu)
    chain = ["old_log_prob", "values", "update_critic", "update_actor"]
    own = {ph: _trainer(p, ph, carried=False) for ph in chain}
    assert own["values"] < own["old_log_prob"], "the critic's forward alone needs less than the actor's"
    floor = 0
    for ph in chain:  # the trainer share never falls within the step, and never below its own terms
        held = _trainer(p, ph, carried=True)
        assert held == max(floor, own[ph]), ph
        floor = held
    assert _trainer(p, "values", carried=True) >= _trainer(p, "old_log_prob", carried=True)
    # the all-gather buffers add on top of the floor: the compute stream cannot reuse them
    ph = p.phase("values")
    assert ph is not None
    gathered = sum(t.bytes for t in ph.terms if ALL_GATHER in t.name)
    assert gathered > 0 and ph.by_process()["trainer"] == _trainer(p, "values", carried=True) + gathered

    off = [
        f"{k}.{x}"
        for k in ("actor_rollout_ref.actor.fsdp_config", "critic.fsdp")
        for x in ("offload_policy=false", "param_offload=true")
    ]
    _, legacy, _ = load_setup("13b-fsdp", ["32gib"], off)
    assert legacy.critic is not None and legacy.critic.param_offload and not legacy.critic.offload_policy
    q = plan_gpu(legacy, gpu)
    for ph in chain:
        assert _trainer(q, ph, carried=True) == _trainer(q, ph, carried=False), ph
    assert _trainer(q, "values", carried=True) < _trainer(q, "old_log_prob", carried=True)


def test_cost_is_priced_from_a_run_of_the_same_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    """The measured rate behind `plan`'s cost line is the committed run that trained the asked-for
    configuration with every fix on that changes the rate, not any run of the recipe: verl's merged
    sync (h200x1-ppo-verl-sync, 183 tokens/s) or the other variant would misprice it several-fold."""
    from verl_recipes.plan.runs import lacks, run_setup
    from verl_recipes.plan.runs import rate_run as _rate_run
    from verl_recipes.predict.setup import load_setup

    _, ppo, _ = load_setup("7b-lora", [], [])
    run = _rate_run(ppo, "7b-lora")
    assert run is not None and run_setup(run) == ppo and not lacks(run, ppo, "rate")
    assert "verl-sync" not in run.run_dir.name
    assert main(["plan", "7b-lora", "--gpu", "h200-141g"]) == 0
    assert f"measured run {run.run_dir.name}:" in capsys.readouterr().out
    # the 24 GB-card settings ran only under --cap-gib: their runs are named, and price nothing
    # (an H200's compute behind a 22.5 GiB slice is no card's rate)
    assert main(["plan", "7b-lora", "--variant", "24gib", "--gpu", "h200-141g", "--gpu", "a10g-24g"]) == 0
    out = capsys.readouterr().out
    assert "h200x1-ppo-24gib-cap22.5" in out and "under 22.5 GiB" in out and "pass --tokens-per-s" in out
    assert "$" not in out.split("cost:", 1)[1]
    # a configuration no run trained at all says so
    assert main(["plan", "7b-lora", "--set", "data.train_batch_size=16", "--gpu", "h200-141g"]) == 0
    assert "no committed run of this configuration measured a rate" in capsys.readouterr().out


def test_a_run_without_a_fix_of_the_rate_prices_nothing_and_stays_memory_evidence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every committed 7b-lora run that lists the fixes it applied and not replay-buffer-poll ran
    with verl's 2-second rollout poll: it prices no job (the rate is not the recipe's) and still
    stands for the job's device memory (the poll allocates nothing). `plan` of such a
    configuration shows the run's peak as the verdict and names the missing fix in its cost line."""
    from verl_recipes.plan.runs import fixed_runs, lacks, memory_run, rate_run, run_setup, trained_runs, unpriced_runs
    from verl_recipes.predict.setup import load_setup

    polled = []
    for run, rs in trained_runs("7b-lora"):
        prov = run.provenance
        if prov.verl_fixes is not None and REPLAY_POLL_FIX not in prov.verl_fixes:
            assert REPLAY_POLL_FIX in run.fixes_off and REPLAY_POLL_FIX in lacks(run, rs, "rate")
            assert REPLAY_POLL_FIX not in lacks(run, rs, "device memory")
            polled.append(run.run_dir)
    assert polled
    assert not {r.run_dir for r, _ in fixed_runs("7b-lora", "rate")} & set(polled)
    memory = {r.run_dir for r, _ in fixed_runs("7b-lora", "device memory")}
    assert memory & set(polled)
    # the configurations whose only whole-job runs went without it: memory evidence, no price
    split = 0
    for variant in get_recipe("7b-lora").variants:
        _, s, _ = load_setup("7b-lora", [variant], [])
        held = memory_run(s, "7b-lora")
        if held is None or rate_run(s, "7b-lora") is not None or held.provenance.cap_gib is not None:
            continue
        split += 1
        assert run_setup(held) == s and lacks(held, s, "rate") and not lacks(held, s, "device memory")
        assert main(["plan", "7b-lora", "--variant", variant, "--gpu", "h200-141g"]) == 0
        out = capsys.readouterr().out
        assert f"h200-141g: measured run (recipes/7b-lora/results/{held.run_dir.name}, on NVIDIA H200)" in out
        cost = out.split("cost:", 1)[1]
        newest, off = unpriced_runs(s, "7b-lora")[0]
        assert f"{newest.run_dir.name} (" in cost and f"went without {', '.join(off)}," in cost and "$" not in cost
    assert split


def test_a_fix_of_the_padding_free_path_concerns_only_runs_that_take_it(tmp_path: Path) -> None:
    """packed-attention registers the attention only the padding-free path's configuration names: a
    padded run without it ran the same code, and stays evidence for memory and rate; a packed
    run without it did not. A fix of the critic's engine concerns no run without a critic, and a
    Megatron fix no FSDP run."""
    from verl_recipes.fixes import (
        FIXES,
        MEGATRON_PIN_FIX,
        PACKED_ATTN_FIX,
        RAY_START_FIX,
        RunKind,
        concerns,
    )
    from verl_recipes.plan.runs import MeasuredRun, lacks, run_kind
    from verl_recipes.recipe.compose import compose_recipe

    recipe = get_recipe("7b-lora")
    arch = Arch.from_file(ARCHS_DIR / recipe.model.arch / "config.json")
    prov = {"verl_fixes_off": [], "verl_fixes": [f for f in FIXES if f != PACKED_ATTN_FIX]}
    kinds = {}
    for variants in ([], ["packed"], ["grpo"]):
        run_dir = tmp_path / "recipes" / "7b-lora" / "results" / "-".join(["run", *variants])
        run_dir.mkdir(parents=True)
        cfg = compose_recipe(recipe, variants, [])
        (run_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
        (run_dir / "provenance.json").write_text(json.dumps(prov))
        run = MeasuredRun(run_dir / "summary.json", "7b-lora", {}, "", {})
        s = setup_from_config(cfg, arch)
        kinds[tuple(variants)] = run_kind(run, s)
        for what in ("device memory", "rate"):
            assert (PACKED_ATTN_FIX in lacks(run, s, what)) == s.remove_padding, (variants, what)
    assert kinds[("packed",)].padding_free and not kinds[()].padding_free
    assert kinds[()].critic and not kinds[("grpo",)].critic
    # the critic's engine batching reaches only a job with a critic
    assert concerns(CRITIC_BATCHING_FIX, "device memory", kinds[()])
    assert not concerns(CRITIC_BATCHING_FIX, "device memory", kinds[("grpo",)])
    # an engine's own fix, on the other engine: nothing; Ray's start: the host and the start-up only
    fsdp = kinds[("packed",)]
    megatron = RunKind("megatron", padding_free=True, critic=True)
    assert not concerns(MEGATRON_PIN_FIX, "host memory", fsdp) and concerns(MEGATRON_PIN_FIX, "host memory", megatron)
    assert not concerns(PACKED_ATTN_FIX, "device memory", megatron)
    assert [concerns(RAY_START_FIX, w, fsdp) for w in ("device memory", "rate", "host memory", "start-up")] == [
        False,
        False,
        True,
        True,
    ]


def test_a_real_megatron_group_is_counted_and_a_rehearsals_fake_one_is_not(root: Path) -> None:
    """70b-3d's 32-GPU job: a real Megatron process group's base (the 2.43 against 0.81 GiB beyond
    the allocator of the plain TP1 runs and the rehearsed ranks) and one communicator's buffers for
    each group a step's collectives touch: TP4, PP2, DP4 with CP and without, TP x PP and the
    default group (`megatron_groups`); the same rank under the fake group counts none. A committed
    rank rehearsal is planned that way, a plain run with its group."""
    import dataclasses

    from verl_recipes.plan.runs import read_run, run_setup

    _, s, _ = load_setup("70b-3d", [], [])
    h100 = parse_gpu("h100-80g")
    c = Constants()
    real, fake = (plan_gpu(x, h100, c) for x in (s, dataclasses.replace(s, fake_group=True)))
    group = _term(real, "update_actor", "trainer process group")
    assert group == c.group_base_bytes_megatron + 6 * c.nccl_bytes_per_communicator
    assert _term(fake, "update_actor", "trainer process group") == 0
    assert real.phase("update_actor").total - fake.phase("update_actor").total == group
    results = root / "recipes" / "70b-3d" / "results"
    assert run_setup(read_run(results / "h200x1-ppo-rank16of32-partial")).fake_group
    assert not run_setup(read_run(results / "h200x1-ppo-tp1pp1-l2")).fake_group


def test_plans_exit_codes_are_in_its_help_and_the_readme(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 fits, 1 does not fit, 2 bad input: what `--help` and the README say is what `plan` returns."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 the job fits every --gpu named" in help_text and "1 it does not fit a --gpu" in help_text
    assert "2 bad input" in help_text
    row = next(ln for ln in (root / "README.md").read_text().splitlines() if ln.startswith("| `plan <id>"))
    assert "exit 0 when the job fits" in row and "1 when it does not fit" in row and "2 on bad input" in row
    # 1 is held by test_cli_json_and_text, 0 by the plan with --tokens-per-s; 2 here
    assert main(["plan", "no-such-recipe", "--gpu", "h200-141g"]) == 2
