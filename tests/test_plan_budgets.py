"""`plan --budgets` (verl_recipes.predict.budgets) and the step prediction (verl_recipes.predict.speed)
on verl 0.9.1's real Hydra config: the prod variant holds the planner's budgets, one step more does
not fit, and the decode roofline is the hand arithmetic of weights + KV read over bandwidth."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf
from verl_recipes import RecipeError
from verl_recipes.plan.cli import budgets_text
from verl_recipes.predict.budgets import MAX_LOGITS, STEP, held, largest, with_budgets
from verl_recipes.predict.gpus import catalogue
from verl_recipes.predict.phases import plan_gpu
from verl_recipes.predict.setup import load_setup
from verl_recipes.predict.speed import decode_roofline, estimate
from verl_recipes.recipe.metadata import get_recipe

H100 = "h100-80g"


@pytest.fixture(scope="module")
def prod() -> Any:
    return load_setup("7b-lora", ["prod"], [])[1]


def test_the_prod_variant_holds_the_budgets_the_planner_chooses_for_an_h100(prod: Any) -> None:
    """config-prod.yaml's settings are what `plan 7b-lora --variant prod --budgets --gpu h100-80g`
    prints: a change to the planner or the file without the other fails here."""
    cfg = OmegaConf.load(get_recipe("7b-lora").dir / "config-prod.yaml")
    b = largest(prod, catalogue()[H100])
    for line in b.sets():
        key, value = line.split("=")
        assert float(OmegaConf.select(cfg, key)) == float(value), line


def test_one_step_more_of_each_budget_does_not_fit(prod: Any) -> None:
    """On an A100 40GB one step more of any setting does not fit, or (the log-prob budget, whose
    padding-free forward holds 4 B a logit) passes the 2^31 logits bound the planner keeps."""
    gpu = catalogue()["a100-40g"]
    b = largest(prod, gpu)
    seq = prod.seq_len
    cap = (MAX_LOGITS // prod.arch.vocab - seq) // STEP * STEP
    util, seqs, batched = b.utilization, b.max_num_seqs, b.max_num_batched_tokens

    def worst(s: Any) -> float:
        return max(held(p) for p in plan_gpu(s, gpu).phases)

    # each budget is judged with a micro-batch one sequence over it (verl balances whole sequences)
    train, infer = b.train_tokens + seq, b.infer_tokens + seq
    assert worst(with_budgets(prod, train, infer, util, seqs, batched)) <= gpu.visible_bytes
    overs = [
        with_budgets(prod, train + STEP, infer, util, seqs, batched),
        with_budgets(prod, train, infer, util + 0.01, seqs, batched),
    ]
    if b.infer_tokens + STEP <= cap:
        overs.append(with_budgets(prod, train, infer + STEP, util, seqs, batched))
    else:
        assert b.infer_tokens == cap
    for over in overs:
        assert worst(over) > gpu.visible_bytes
    # the KV cache holds max_num_seqs whole sequences, and not one more
    assert b.max_num_seqs * seq <= b.plan.kv_tokens < (b.max_num_seqs + 1) * seq


def test_an_h100s_budgets_keep_a_micro_batchs_logits_within_2_31_elements(prod: Any) -> None:
    """On an H100 80GB memory would hold more; the logits of a micro-batch one sequence over the
    budget (tokens x 32,000) stay within 2^31 elements, and one step more would pass them."""
    b = largest(prod, catalogue()[H100])
    seq, vocab = prod.seq_len, 32000
    for budget in (b.train_tokens, b.infer_tokens):
        assert (budget + seq) * vocab < 2**31 <= (budget + STEP + seq) * vocab


def test_the_decode_roofline_is_weights_and_kv_read_over_the_bandwidth(prod: Any) -> None:
    """84 Llama-2-7B sequences of 128 + 1,024 tokens on an H100: each decode step reads the bf16
    weights (6,738,415,616 x 2 B) and 84 x (128 + 512) tokens of KV at 32 x 2 x 4,096 x 2 B each,
    over 3.35 TB/s; 512 sequences are 6 waves of 84 and one of 8, 1,024 steps each."""
    gpu = catalogue()[H100]
    s = largest(prod, gpu).applied(prod)
    d = decode_roofline(s, gpu)
    weights, kv = 6_738_415_616 * 2, 32 * 2 * 4096 * 2
    assert d.concurrent == 84
    assert d.step_ms == pytest.approx(1000 * (weights + 84 * 640 * kv) / 3.35e12, abs=1e-3)
    rollout = 1024 * (6 * (weights + 84 * 640 * kv) + (weights + 8 * 640 * kv)) / 3.35e12
    assert d.rollout_s == pytest.approx(rollout, rel=1e-6)
    e = estimate(s, gpu)
    assert e.tokens == 512 * 1152
    # GRPO, the LoRA reference, the weight sync
    assert set(e.phases) == {"gen", "old_log_prob", "ref", "update_actor", "update_weights"}


def test_budgets_refuse_fixed_micro_batches_in_one_line() -> None:
    s = load_setup("7b-lora", ["grpo"], [])[1]
    with pytest.raises(RecipeError, match="use_dynamic_bsz=true"):
        largest(s, catalogue()[H100])


def test_plan_budgets_prints_set_lines_a_step_and_its_cost(prod: Any) -> None:
    text = budgets_text("7b-lora +prod", prod, [catalogue()[H100]])
    assert "--set actor_rollout_ref.rollout.max_num_seqs=84" in text
    assert "PREDICTED" in text and "per million tokens" in text
    # the bandwidths the roofline divides by, each from the vendor page the catalogue cites
    rated = {g.id: g.bandwidth for g in catalogue().values() if g.bandwidth}
    assert rated == {"a100-40g": 1.555e12, "a100-80g": 2.039e12, "h100-80g": 3.35e12, "h200-141g": 4.8e12}


def test_the_smaller_micro_batch_knob_halves_each_budget_by_its_own_key(prod: Any) -> None:
    """The prod variant names its log-prob budgets, so halving the update's alone would leave
    them: the knob's --set lines carry every budget it halves, and the plan it judges has them."""
    from verl_recipes.predict.knobs import _micro_batch_knob

    knob = _micro_batch_knob(prod)
    assert knob is not None
    half = prod.actor.max_tokens_train // 2
    assert set(knob.sets) >= {
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={half}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={prod.actor.max_tokens_infer // 2}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={prod.actor.max_tokens_infer // 2}",
    }
    assert (knob.setup.actor.max_tokens_train, knob.setup.actor.max_tokens_infer) == (half, 32768)
