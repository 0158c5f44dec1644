"""Tests of the DeepSpeed PPO baseline of recipe verl-vs-deepspeed (recipes/verl-vs-deepspeed/ds_ppo).

What they pin down:
- the baseline's loss path is verl's math: same advantages, returns, policy and value losses as
  calling verl.trainer.ppo.core_algos directly with the defaults verl's trainer uses, bit for bit,
  and the comparison notices a changed constant;
- micro-batching and data parallelism do not change the loss (verl's global token-mean);
- the loop runs two PPO steps on a tiny random Qwen2 on a CPU (plain-torch engines) with finite
  losses, and the harness writes results.json, table.md and plot.png and joins a verl JSONL;
- the shared workload: exact prompt lengths, the ZeRO-3 memory pre-flight for Qwen2-7B, and Hydra
  overrides that verl's own config accepts;
- a rank rehearsal says so wherever it shows numbers and counts the rank's own work, a real job's
  outputs stay as they were, and a DeepSpeed run folder is a monitored run in the project's
  formats (`verl-recipes report` reads its phases, check-bounds holds the committed runs).
The slow tests run the real DeepSpeed ZeRO-3 path on 2 CPU ranks (gloo) and as a rehearsed rank
of 2; the gpu test on CUDA.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("transformers")
import torch
from verl_recipes.layout import RankSpec

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "verl-vs-deepspeed"
sys.path.insert(0, str(RECIPE))

from ds_ppo import engines, harness, losses, records, workload  # noqa: E402
from ds_ppo.loop import PPOLoop, Shapes, StepBatch  # noqa: E402
from ds_ppo.timing import Dist  # noqa: E402

# torchrun, through the interpreter that runs the tests (no console script needed on PATH).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ---------------------------------------------------------------------------------------------
# Fixtures: a tiny Qwen2 (2 layers, hidden 64), a small BPE tokenizer, a verl RL parquet


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    r = random.Random(0)
    corpus = [f"What is {r.randint(1, 99)} + {r.randint(1, 99)}? #### {r.randint(2, 198)}" for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import pandas as pd
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    base = tmp_path_factory.mktemp("ds_ppo")
    tok = _tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(base / "model")
    tok.save_pretrained(base / "model")
    r = random.Random(1)
    rows = []
    for i in range(40):
        a, b = r.randint(1, 99), r.randint(1, 99)
        rows.append(
            {
                "data_source": "arith",
                "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
        )
    pd.DataFrame(rows).to_parquet(base / "train.parquet", index=False)
    # Reloaded, as both sides load it: a saved tokenizer can split differently from the in-memory one.
    tok = AutoTokenizer.from_pretrained(base / "model")
    n = workload.write_fixed_parquet(base / "train.parquet", tok, 40, base / "fixed.parquet")["rows"]
    assert n >= 16
    return {
        "dir": base,
        "model": base / "model",
        "raw": base / "train.parquet",
        "fixed": base / "fixed.parquet",
    }


# ---------------------------------------------------------------------------------------------
# The math is verl's


def _verl_yaml() -> dict[str, Any]:
    import verl
    import yaml

    return yaml.safe_load((Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml").read_text())


def test_hyper_defaults_are_verls() -> None:
    """PPOHyper takes verl's trainer defaults; they are also verl's dataclass defaults and the seed's."""
    import dataclasses

    from verl.trainer.config import AlgoConfig
    from verl.workers.config import ActorConfig, CriticConfig

    hp = losses.PPOHyper.from_verl_defaults()
    actor_defaults = {f.name: f.default for f in dataclasses.fields(ActorConfig)}
    critic_defaults = {f.name: f.default for f in dataclasses.fields(CriticConfig)}
    assert hp.clip_ratio == actor_defaults["clip_ratio"] == 0.2
    assert hp.clip_ratio_c == actor_defaults["clip_ratio_c"] == 3.0
    assert hp.loss_agg_mode == actor_defaults["loss_agg_mode"] == "token-mean"
    assert hp.cliprange_value == critic_defaults["cliprange_value"] == 0.5
    algo = AlgoConfig()
    assert (hp.gamma, hp.lam, hp.kl_penalty, hp.kl_coef) == (
        algo.gamma,
        algo.lam,
        algo.kl_penalty,
        algo.kl_ctrl.kl_coef,
    )
    assert (hp.actor_lr, hp.critic_lr, hp.grad_clip) == (1e-6, 1e-5, 1.0)
    assert losses.PPOHyper.from_verl_defaults(clip_ratio=0.3).clip_ratio == 0.3


def _batch(seed: int = 0, b: int = 6, r: int = 12) -> dict[str, torch.Tensor]:
    """Random PPO tensors with ragged response masks, log-prob ratios far enough apart to clip."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(r // 2, r + 1, (b,), generator=g)
    mask = (torch.arange(r)[None, :] < lengths[:, None]).long()
    old = -torch.rand(b, r, generator=g) * 3
    return {
        "mask": mask,
        "scores": torch.randint(0, 2, (b,), generator=g).float(),
        "old": old,
        "ref": old + torch.randn(b, r, generator=g) * 0.3,
        "logp": old + torch.randn(b, r, generator=g) * 0.5,
        "values": torch.randn(b, r, generator=g),
        "vpreds": torch.randn(b, r, generator=g) * 2,
    }


def _baseline(t: dict[str, torch.Tensor], hp: losses.PPOHyper) -> dict[str, torch.Tensor]:
    """The DeepSpeed loop's loss path on one batch."""
    scores = losses.outcome_scores(t["scores"], t["mask"])
    rewards, _ = losses.kl_in_reward(scores, t["old"], t["ref"], t["mask"], hp)
    adv, ret = losses.advantages_returns(rewards, t["values"], t["mask"], hp)
    pg, _ = losses.policy_loss(
        losses.actor_config(hp), t["old"], t["logp"], adv, t["mask"], batch_num_tokens=None, dp_size=1
    )
    vf, _ = losses.value_loss(hp, t["vpreds"], t["values"], ret, t["mask"], batch_num_tokens=None, dp_size=1)
    return {"adv": adv, "ret": ret, "pg": pg, "vf": vf, "rewards": rewards}


def _verl_direct(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """verl's core_algos called directly with the defaults its trainer, actor and critic use."""
    from verl.trainer.ppo import core_algos

    cfg = _verl_yaml()
    actor, critic, algo = cfg["actor_rollout_ref"]["actor"], cfg["critic"], cfg["algorithm"]
    mask = t["mask"]
    scores = torch.zeros(mask.shape)
    last = mask.sum(-1) - 1
    scores[torch.arange(mask.shape[0]), last] = t["scores"]  # verl's reward manager: last valid token
    penalty: Any = core_algos.kl_penalty  # annotated FloatTensor; takes any float tensor
    kld = penalty(t["old"], t["ref"], kl_penalty=algo["kl_penalty"]) * mask
    rewards = scores - algo["kl_ctrl"]["kl_coef"] * kld
    adv, ret = core_algos.compute_gae_advantage_return(rewards, t["values"], mask, algo["gamma"], algo["lam"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compute_policy_loss is marked deprecated; it is verl's reference form
        pg, *_ = core_algos.compute_policy_loss(
            t["old"],
            t["logp"],
            adv,
            mask.bool(),
            cliprange=actor["clip_ratio"],
            clip_ratio_c=actor["clip_ratio_c"],
            loss_agg_mode=actor["loss_agg_mode"],
        )
    vf, _ = core_algos.compute_value_loss(
        t["vpreds"],
        ret,
        t["values"],
        mask.bool(),
        cliprange_value=critic["cliprange_value"],
        loss_agg_mode=actor["loss_agg_mode"],
    )
    return {"adv": adv, "ret": ret, "pg": pg, "vf": vf, "rewards": rewards}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_path_is_verls_bit_for_bit(seed: int) -> None:
    t = _batch(seed)
    ours, ref = _baseline(t, losses.PPOHyper.from_verl_defaults()), _verl_direct(t)
    for k in ("rewards", "adv", "ret", "pg", "vf"):
        assert torch.equal(ours[k], ref[k]), k
    assert ours["pg"].abs() > 0 and ours["vf"] > 0


@pytest.mark.parametrize(
    ("change", "affected"),
    [
        ({"clip_ratio": 0.25, "clip_ratio_low": 0.25, "clip_ratio_high": 0.25}, "pg"),
        ({"cliprange_value": 0.4}, "vf"),
        ({"gamma": 0.99}, "adv"),
        ({"lam": 0.95}, "adv"),
        ({"kl_coef": 0.01}, "rewards"),
        ({"clip_ratio_c": 1.5}, "pg"),
    ],
)
def test_equivalence_check_catches_a_changed_constant(change: dict[str, float], affected: str) -> None:
    t = _batch(0)
    ours = _baseline(t, losses.PPOHyper.from_verl_defaults(**change))
    assert not torch.allclose(ours[affected], _verl_direct(t)[affected]), f"{change} went unnoticed"


def test_micro_batches_and_ranks_give_the_global_token_mean() -> None:
    """Per-micro losses normalised by the global token count, summed and averaged over 2 'ranks',
    equal the token-mean over the whole mini-batch (what verl's FSDP engine optimises)."""
    hp = losses.PPOHyper.from_verl_defaults()
    t = _batch(3, b=8)
    full = _baseline(t, hp)
    adv, ret, mask = full["adv"], full["ret"], t["mask"]
    ntok, world = int(mask.sum()), 2
    cfg = losses.actor_config(hp)
    pg_ranks, vf_ranks = [], []
    for rank in range(world):
        pg_sum = vf_sum = torch.tensor(0.0)
        for s in (slice(rank * 4, rank * 4 + 2), slice(rank * 4 + 2, rank * 4 + 4)):
            pg, _ = losses.policy_loss(
                cfg, t["old"][s], t["logp"][s], adv[s], mask[s], batch_num_tokens=ntok, dp_size=world
            )
            vf, _ = losses.value_loss(
                hp, t["vpreds"][s], t["values"][s], ret[s], mask[s], batch_num_tokens=ntok, dp_size=world
            )
            pg_sum, vf_sum = pg_sum + pg, vf_sum + vf
        pg_ranks.append(pg_sum)
        vf_ranks.append(vf_sum)
    torch.testing.assert_close(sum(pg_ranks) / world, full["pg"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sum(vf_ranks) / world, full["vf"], rtol=1e-6, atol=1e-7)
    # Normalising each micro-batch by its own tokens instead would be a different loss:
    local, _ = losses.policy_loss(cfg, t["old"][:2], t["logp"][:2], adv[:2], mask[:2], batch_num_tokens=None, dp_size=1)
    assert not torch.allclose(local * int(mask[:2].sum()) / ntok, local)


def test_response_slicing_matches_a_hand_computed_log_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    b, p, r, v = 3, 5, 4, 11
    ids = torch.randint(0, v, (b, p + r), generator=g)
    logits = torch.randn(b, p + r, v, generator=g)
    lp = losses.response_logprobs(logits, ids, r, 1.0)
    want = torch.log_softmax(logits[:, p - 1 : p + r - 1], -1).gather(-1, ids[:, p:, None])[..., 0]
    torch.testing.assert_close(lp, want)
    # HF logits_to_keep=r+1 returns only the tail; the slice must give the same numbers.
    torch.testing.assert_close(losses.response_logprobs(logits[:, -(r + 1) :], ids, r, 1.0), want)
    torch.testing.assert_close(
        losses.response_logprobs(logits, ids, r, 2.0),
        torch.log_softmax(logits[:, p - 1 : p + r - 1] / 2, -1).gather(-1, ids[:, p:, None])[..., 0],
    )
    vals = torch.randn(b, p + r, 1, generator=g)
    torch.testing.assert_close(losses.response_values(vals, r), vals[:, p - 1 : p + r - 1, 0])


# ---------------------------------------------------------------------------------------------
# The loop and the harness on a CPU


def test_loop_two_ppo_steps_on_cpu(tiny: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    hp = losses.PPOHyper.from_verl_defaults()
    tok = AutoTokenizer.from_pretrained(tiny["model"])
    torch.manual_seed(0)
    am: Any = engines.load_actor(str(tiny["model"]), torch.float32, grad_ckpt="non-reentrant")
    cm: Any = engines.load_critic(str(tiny["model"]), torch.float32, grad_ckpt="non-reentrant")
    actor = engines.TorchEngine(am, engines.adamw(am, 1e-3, 0.01, hp.betas), accumulation_steps=2)
    critic = engines.TorchEngine(cm, engines.adamw(cm, 1e-3, 0.01, hp.betas), accumulation_steps=2)
    ref = engines.TorchEngine(engines.load_ref(str(tiny["model"]), torch.float32), None)
    shapes = Shapes(prompt_len=40, response_len=8, mini_batch_per_gpu=4, train_micro=2, infer_micro=4)
    loop = PPOLoop(actor, critic, ref, tok, hp, shapes, Dist())
    rows = workload.read_rows(tiny["fixed"], limit=16)
    before_a = am.model.layers[0].mlp.up_proj.weight.detach().clone()
    before_c = cm.score.weight.detach().clone()
    for step in range(2):
        mine = rows[step * 8 : (step + 1) * 8]
        ids, mask = workload.encode_prompts([workload.chat_ids(tok, r.messages) for r in mine], 40, tok.pad_token_id)
        assert bool(mask.all()), "fixed-length prompts need no padding"
        res = loop.step(StepBatch(ids, mask, [r.ground_truth for r in mine], [r.data_source for r in mine]))
        m = res["metrics"]
        for k in (
            "actor/pg_loss",
            "critic/vf_loss",
            "actor/grad_norm",
            "critic/grad_norm",
            "actor/ppo_kl",
            "actor/pg_clipfrac",
            "critic/vf_clipfrac",
            "actor/reward_kl_penalty",
        ):
            assert math.isfinite(m[k]), (k, m[k])
        assert m["critic/vf_loss"] > 0
        assert res["tokens"] == 8 * (40 + 8) and res["response_tokens"] == 8 * 8
        for phase in (
            "gen",
            "reward",
            "old_log_prob",
            "ref",
            "values",
            "adv",
            "update_critic",
            "update_actor",
            "switch_actor_to_critic",
            "switch_critic_to_actor",
        ):
            assert res["timing_s"][phase] > 0, phase
        assert res["step_s"] >= res["timing_s"]["gen"]
    assert not torch.equal(before_a, am.model.layers[0].mlp.up_proj.weight), "the actor did not step"
    assert not torch.equal(before_c, cm.score.weight), "the critic did not step"


@pytest.fixture
def compare(monkeypatch: pytest.MonkeyPatch) -> Any:
    """compare.py as a module; the allocator setting it makes on import is undone afterwards."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    import compare as mod

    return mod


def _ds_args(tiny: dict[str, Path], out: Path) -> list[str]:
    return [
        "--model",
        str(tiny["model"]),
        "--data",
        str(tiny["fixed"]),
        "--prompt-len",
        "40",
        "--response-len",
        "8",
        "--batch",
        "8",
        "--mini-batch",
        "4",
        "--train-micro",
        "2",
        "--infer-micro",
        "4",
        "--warmup-steps",
        "1",
        "--measured-steps",
        "2",
        "--out",
        str(out),
    ]


def test_harness_writes_results_and_joins_a_verl_run(tiny: dict[str, Path], tmp_path: Path, compare: Any) -> None:
    out = tmp_path / "ds"
    assert compare.main(["ds", "--backend", "torch", "--device", "cpu", *_ds_args(tiny, out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert len(res["ds"]["steps"]) == 3
    summ = res["ds"]["summary"]
    assert summ["step_s"]["n"] == 2  # the warm-up step is excluded
    assert summ["step_s"]["min"] <= summ["step_s"]["median"] <= summ["step_s"]["max"]
    step = res["ds"]["steps"][1]["table"]
    assert step["tokens"] == 8 * 48
    assert step["gen_tok_s"] == pytest.approx(step["tokens"] / step["gen_s"])
    assert step["overall_tok_s"] == pytest.approx(step["tokens"] / step["step_s"])
    run = res["run"]
    assert run["workload"]["batch"] == 8 and run["packages"]["torch"] and run["date_utc"]
    assert run["prompt_len_mismatch"] == 0
    assert (out / "plot.png").stat().st_size > 10_000
    assert "plain torch" in (out / "table.md").read_text()

    # A verl metrics file in FileLogger's format: two steps, the first one warm-up.
    verl = tmp_path / "verl.jsonl"
    lines = []
    for s, (step_s, gen) in enumerate([(30.0, 10.0), (20.0, 8.0)], start=1):
        lines.append(
            json.dumps(
                {
                    "step": s,
                    "data": {
                        "timing_s/step": step_s,
                        "timing_s/gen": gen,
                        "timing_s/update_actor": 5.0,
                        "timing_s/update_critic": 4.0,
                        "perf/total_num_tokens": 384,
                        "perf/throughput": 384 / step_s / 2,
                    },
                }
            )
        )
    verl.write_text("\n".join(lines) + "\n")
    rep = tmp_path / "report"
    assert compare.main(["report", "--ds", str(out), "--verl", str(verl), "--verl-warmup", "1", "--out", str(rep)]) == 0
    both = json.loads((rep / "results.json").read_text())
    v = both["verl"]["summary"]
    assert v["step_s"] == {"min": 20.0, "median": 20.0, "max": 20.0, "n": 1}
    assert v["gen_tok_s"]["median"] == pytest.approx(384 / 8.0)
    assert v["train_tok_s"]["median"] == pytest.approx(384 / 9.0)
    assert v["overall_tok_s_per_gpu"]["median"] == pytest.approx(384 / 20.0 / 2)  # GPUs from perf/throughput
    table = (rep / "table.md").read_text()
    assert table.splitlines()[0].endswith("| verl |")
    assert "48.00" in table  # verl generation throughput, median


def test_time_budget_stops_between_steps(tiny: dict[str, Path], tmp_path: Path, compare: Any) -> None:
    out = tmp_path / "ds"
    args = [*_ds_args(tiny, out), "--time-budget-s", "0.001"]
    assert compare.main(["ds", "--backend", "torch", "--device", "cpu", *args]) == 0
    res = json.loads((out / "results.json").read_text())
    assert len(res["ds"]["steps"]) == 1
    assert any("stopped after 1 of 3" in n for n in res["notes"])


def test_nvml_peaks_are_joined_by_wall_clock() -> None:
    gib = 1024**3
    samples = [
        {"t": t, "gpus": [{"index": 0, "used": u * gib}, {"index": 1, "used": (u + 1) * gib}]}
        for t, u in [(0.5, 9), (1.0, 2), (1.5, 5), (2.5, 7), (3.5, 4), (4.5, 30)]
    ]
    intervals = [("gen", 1.0, 2.0), ("values", 2.0, 3.0), ("update_actor", 3.0, 4.0)]
    p = harness.nvml_step_peaks(samples, (1.0, 4.0), intervals)
    assert p["nvml_peak_gib_per_gpu"] == {"0": 7.0, "1": 8.0}
    assert p["nvml_actor_phase_peak_gib_per_gpu"] == {"0": 5.0, "1": 6.0}
    assert p["nvml_critic_phase_peak_gib_per_gpu"] == {"0": 7.0, "1": 8.0}
    assert p["nvml_swing_gib_per_gpu"] == {"0": 5.0, "1": 5.0}
    assert harness.flatten_nvml(p)["nvml_peak_gib"] == 8.0


def test_read_verl_metrics_accepts_both_logger_formats(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text('{"step": 2, "data": {"timing_s/step": 2.0}}\n{"step": 1, "data": {"timing_s/step": 1.0}}\n')
    b = tmp_path / "b.jsonl"
    b.write_text('{"t": 0, "step": 1, "pid": 3, "metrics": {"timing_s/step": 1.0}}\n')
    assert [m["timing_s/step"] for m in harness.read_verl_metrics(a)] == [1.0, 2.0]
    assert harness.read_verl_metrics(b)[0]["timing_s/step"] == 1.0


# ---------------------------------------------------------------------------------------------
# The workload


def test_fixed_prompts_are_exactly_prompt_len(tiny: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny["model"])
    raw = workload.read_rows(tiny["raw"])
    fixed = workload.read_rows(tiny["fixed"])
    assert all(len(workload.chat_ids(tok, r.messages)) == 40 for r in fixed)
    assert all(len(workload.chat_ids(tok, r.messages)) < 40 for r in raw)
    by_question = {r.messages[-1]["content"]: r.ground_truth for r in raw}
    for r in fixed:  # the question and its ground truth survive, after the filler
        q = r.messages[-1]["content"].split("\n")[-1]
        assert by_question[q] == r.ground_truth
    assert workload.fit_messages(tok, raw[0].messages, 3) is None  # cannot shrink a prompt


def test_encode_prompts_left_pads_and_left_truncates() -> None:
    ids, mask = workload.encode_prompts([[5, 6], [1, 2, 3, 4, 5]], 4, pad_id=0)
    assert ids.tolist() == [[0, 0, 5, 6], [2, 3, 4, 5]]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_zero3_preflight_for_qwen2_7b() -> None:
    counts = workload.param_counts(ROOT / "common/verl_recipes/workload/archs/qwen2-7b")
    assert counts.actor == 7_615_616_512  # recipe.yaml's params
    hidden, vocab = 3584, 152064
    assert counts.critic == counts.actor - vocab * hidden + hidden + 1  # lm_head -> 1-output score
    h200 = int(139.8 * 1024**3)
    per_gpu_2 = workload.zero3_state_bytes_per_gpu(counts, 2, use_ref=True) / 1024**3
    assert 115 < per_gpu_2 < 118
    assert workload.memory_preflight(counts, 2, True, h200, 12.0) is None
    why = workload.memory_preflight(counts, 1, True, h200, 12.0)
    assert why is not None and ">= 2 GPUs" in why


def test_workload_checks_divisibility() -> None:
    w = workload.Workload(model="m", data="d", batch=128, mini_batch=32, train_micro_per_gpu=4)
    w.check(1)
    w.check(2)
    with pytest.raises(ValueError, match="multiple of the 3 GPUs"):
        w.check(3)
    with pytest.raises(ValueError, match="--train-micro"):
        workload.Workload(model="m", data="d", mini_batch=32, train_micro_per_gpu=3).check(2)


def test_verl_overrides_compose_against_verls_config() -> None:
    """Every override names a real key of verl 0.9.1's ppo_trainer (Hydra rejects unknown ones)."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    w = workload.Workload(model="/m", data="/d/fixed.parquet")
    ovs = workload.verl_overrides(w, n_gpus=2, kl_coef=0.001)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer/config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=ovs)
    GlobalHydra.instance().clear()
    assert cfg.data.train_batch_size == 128 and cfg.data.max_prompt_length == 512
    assert cfg.data.max_response_length == 512 and cfg.data.shuffle is False
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 32
    assert cfg.actor_rollout_ref.rollout.ignore_eos is True
    assert cfg.algorithm.use_kl_in_reward is True and cfg.algorithm.kl_ctrl.kl_coef == 0.001
    assert cfg.trainer.total_training_steps == 7 and cfg.trainer.n_gpus_per_node == 2


def test_workload_defaults_match_the_recipes_verl_config() -> None:
    """The DeepSpeed side's defaults and recipes/verl-vs-deepspeed/config.yaml describe one workload."""
    import yaml

    cfg = yaml.safe_load((RECIPE / "config.yaml").read_text()) or {}
    w = workload.Workload(model="m", data="d")
    pairs = [
        (("data", "train_batch_size"), w.batch),
        (("data", "max_prompt_length"), w.prompt_len),
        (("data", "max_response_length"), w.response_len),
        (("actor_rollout_ref", "actor", "ppo_mini_batch_size"), w.mini_batch),
        (("actor_rollout_ref", "actor", "ppo_micro_batch_size_per_gpu"), w.train_micro_per_gpu),
        (("critic", "ppo_micro_batch_size_per_gpu"), w.train_micro_per_gpu),
        (("actor_rollout_ref", "ref", "log_prob_micro_batch_size_per_gpu"), w.infer_micro_per_gpu),
        (("actor_rollout_ref", "rollout", "log_prob_micro_batch_size_per_gpu"), w.infer_micro_per_gpu),
        (("actor_rollout_ref", "rollout", "ignore_eos"), True),
    ]
    checked = 0
    for path, want in pairs:
        node: Any = cfg
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            assert node == want, (".".join(path), node, want)
            checked += 1
    assert checked >= 3, "config.yaml no longer states the workload"


def test_ds_config_is_zero3_bf16() -> None:
    base = engines.load_ds_config()
    assert base["zero_optimization"]["stage"] == 3 and base["bf16"]["enabled"] is True
    cfg = engines.ds_config(base, micro_per_gpu=4, accumulation_steps=4, world=2)
    assert cfg["train_batch_size"] == 32 and "train_batch_size" not in base


# ---------------------------------------------------------------------------------------------
# The real DeepSpeed path


@pytest.mark.slow
def test_deepspeed_zero3_on_two_cpu_ranks(tiny: dict[str, Path], tmp_path: Path) -> None:
    """ZeRO-3 engines, synced generate, gathered GAE, on 2 gloo ranks (DS_ACCELERATOR=cpu)."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds"
    args = _ds_args(tiny, out)
    args[args.index("--train-micro") + 1] = "1"  # 4 prompts per step over 2 ranks: 2 per mini-batch
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    cmd = [
        *TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        "2",
        str(RECIPE / "compare.py"),
        "ds",
        "--backend",
        "deepspeed",
        "--device",
        "cpu",
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # gloo for every collective: DeepSpeed's shared-memory op is neither built nor loaded
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["run"]["world"] == 2 and res["run"]["backend"] == "deepspeed"
    assert res["run"]["ds_config_train"]["gradient_accumulation_steps"] == 2
    for s in res["ds"]["steps"]:
        assert s["tokens"] == 8 * 48
        assert all(math.isfinite(s["metrics"][k]) for k in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm"))


@pytest.mark.gpu
def test_deepspeed_on_cuda_records_nvml(tiny: dict[str, Path], tmp_path: Path) -> None:
    """On a GPU host: ZeRO-3 on CUDA over NCCL (2 ranks where there are 2 GPUs), NVML joined to steps."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds"
    ranks = min(2, torch.cuda.device_count())
    cmd = [
        *TORCHRUN,
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        str(RECIPE / "compare.py"),
        "ds",
        *_ds_args(tiny, out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["run"]["gpu_name"] and res["run"]["gpu"]["driver"] and res["run"]["world"] == ranks
    for s in res["ds"]["steps"]:
        assert s["table"]["nvml_peak_gib"] > 0
        assert len(s["torch_memory"]) == ranks and s["torch_memory"][0]["max_allocated_gib"] > 0
    assert res["ds"]["summary"]["switch_actor_to_critic_s"]["median"] > 0


def _run_both(root: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "recipes/verl-vs-deepspeed/run-both.sh", str(out), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ---------------------------------------------------------------------------------------------
# Rank rehearsals, and the run as a monitored run (the committed H200 runs and a CPU rehearsal)

RESULTS = RECIPE / "results"
REHEARSED = {"h200x1-ppo-rank0of4-deepspeed": (0, 4), "h200x1-ppo-rank0of2-deepspeed": (0, 2)}
#: the host path each committed run had, which its summary and report name (as ingested runs do)
HOST_DIR = {
    "h200x1-ppo-rank0of4-deepspeed": "/tmp/campaign/rank/runs/vvd-ds-rank0of4/ds",
    "h200x1-ppo-rank0of2-deepspeed": "/tmp/campaign/rank/runs/vvd-ds-rank0of2/ds",
}


def _check_rehearsal_labels(out: Path, rank: tuple[int, int]) -> None:
    """What every output of a rehearsal must say, and count, whatever the run."""
    from verl_recipes.measure.report import rank_line

    run = json.loads((out / "run.json").read_text())
    assert run["rank_rehearsal"] == {"rank": rank[0], "world": rank[1]}
    res = json.loads((out / "results.json").read_text())
    assert res["rank_rehearsal"] == {"rank": rank[0], "world": rank[1], "line": rank_line(RankSpec(*rank))}
    lines = (out / "table.md").read_text().splitlines()
    assert lines[0] == rank_line(RankSpec(*rank))
    for row in lines[4:]:
        if not row.startswith("| "):
            break
        label, unit = (c.strip() for c in row.strip("|").split("|")[:2])
        speed = unit in harness.SPEED_UNITS
        assert ("its compute alone" in label) == speed, row
    for s in res["ds"]["steps"]:
        t = s["table"]  # the rank's tokens are its own: per GPU is the rank's rate, not a world-th of it
        rate = s["tokens"] / s["step_s"]
        assert t["overall_tok_s_per_gpu"] == pytest.approx(t["overall_tok_s"]) == pytest.approx(rate)
        assert len(s["torch_memory"]) == 1  # the one real process, never copies from the fake group
    prov = json.loads((out / "provenance.json").read_text())
    assert (prov["backend"], prov["rank_rehearsal"]) == ("deepspeed", {"rank": rank[0], "world": rank[1]})


@pytest.mark.parametrize("name", sorted(REHEARSED))
def test_a_committed_rehearsal_says_so_and_counts_the_ranks_own_work(name: str, tmp_path: Path) -> None:
    """results.json and table.md of the committed rehearsals are what the harness writes from their
    records today (rank line first, speed rows labelled, per-GPU rate the rank's own, one process's
    torch memory), and they carry the label."""
    src = RESULTS / name
    run, steps = harness.load_ds_dir(src)
    harness.write_report(tmp_path, run, steps)
    for f in ("table.md", "results.json"):
        assert (tmp_path / f).read_text() == (src / f).read_text(), f"{name}/{f} is stale: compare.py report"
    _check_rehearsal_labels(src, REHEARSED[name])


def test_a_real_jobs_outputs_are_what_they_were(tmp_path: Path) -> None:
    """A run of a real job (no rehearsal) reads back to the very results.json and table.md it wrote:
    no label, per-GPU rate over its world."""
    src = RESULTS / "h200x1-ppo-l8" / "ds"
    run, steps = harness.load_ds_dir(src)
    assert harness.rank_of(run) is None and harness.token_gpus(run) == run["world"]
    harness.write_report(tmp_path, run, steps)
    for f in ("table.md", "results.json"):
        assert (tmp_path / f).read_text() == (src / f).read_text(), f
    assert "rank_rehearsal" not in json.loads((tmp_path / "results.json").read_text())


def _phase_seconds(steps: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    """(step, phase) -> seconds between the loop's own wall-clock stamps (steps.jsonl intervals)."""
    out: dict[tuple[int, str], float] = {}
    for s in steps:
        for name, a, b in s["intervals"]:
            out[(s["step"], name)] = out.get((s["step"], name), 0.0) + b - a
    return out


def _check_summary_phases(summary: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """The report's phases are the DeepSpeed loop's: every interval it timed, with its length, and
    its step times and token rates from the derived metrics."""
    seconds = _phase_seconds(steps)
    by_step = {st["step"]: st for st in summary["steps"]}
    assert sorted(by_step) == [s["step"] for s in steps]
    for (step, name), sec in seconds.items():
        assert by_step[step]["phases"][name]["duration_s"] == pytest.approx(sec, abs=1e-3), (step, name)
    for s in steps:
        st = by_step[s["step"]]
        assert st["time_s"] == pytest.approx(s["step_s"], abs=1e-3)
        assert st["timing_s"]["gen"] == pytest.approx(s["timing_s"]["gen"], abs=1e-3)
        assert st["throughput"] == pytest.approx(s["table"]["overall_tok_s_per_gpu"])


@pytest.mark.parametrize("name", sorted(REHEARSED))
def test_a_committed_deepspeed_run_is_a_monitored_run(name: str, tmp_path: Path) -> None:
    """The committed runs' phases.jsonl, metrics.jsonl and provenance.json are what `compare.py
    records` derives from run.json and steps.jsonl, and `verl-recipes report` on them gives the
    committed summary: phases from the DeepSpeed intervals, headed by the rank line."""
    from verl_recipes.measure.report import rank_line, summarize

    src = RESULTS / name
    run = tmp_path / name
    shutil.copytree(src, run, ignore=shutil.ignore_patterns(*records.FILES, "summary.json", "report.md", "*.png"))
    written = records.write_records(run, *harness.load_ds_dir(run))
    assert [p.name for p in written] == list(records.FILES)
    for f in records.FILES:
        assert (run / f).read_text() == (src / f).read_text(), f"{name}/{f} is stale: compare.py records"
    summary = summarize(run)
    committed = json.loads((src / "summary.json").read_text())
    assert committed["run_dir"] == HOST_DIR[name]
    assert {**summary, "run_dir": HOST_DIR[name]} == committed, f"{name}/summary.json is stale: verl-recipes report"
    _, steps = harness.load_ds_dir(src)
    _check_summary_phases(committed, steps)
    report = (src / "report.md").read_text().splitlines()
    assert (
        report[0] == f"# Memory report: {HOST_DIR[name]}" and report[2] == f"- {rank_line(RankSpec(*REHEARSED[name]))}"
    )
    assert (src / "samples.jsonl.gz").is_file() and not (src / "samples.jsonl").exists()


def test_records_of_a_rehearsal_made_before_run_json_said_so(tmp_path: Path, compare: Any) -> None:
    """`compare.py records RUN --rank-rehearsal R/N` adds the rehearsal to an older run.json when the
    records agree (the world, torch memory of one process), and refuses when they do not."""
    run = tmp_path / "ds"
    shutil.copytree(RESULTS / "h200x1-ppo-rank0of4-deepspeed", run)
    rec = json.loads((run / "run.json").read_text())
    del rec["rank_rehearsal"]
    (run / "run.json").write_text(json.dumps(rec, indent=1) + "\n")
    assert compare.main(["records", str(run), "--rank-rehearsal", "0/2"]) == 2  # a world of 4 ran
    assert "rank_rehearsal" not in json.loads((run / "run.json").read_text())
    assert compare.main(["records", str(run), "--rank-rehearsal", "0/4"]) == 0
    assert (run / "run.json").read_text() == (RESULTS / "h200x1-ppo-rank0of4-deepspeed" / "run.json").read_text()
    assert compare.main(["records", str(run), "--rank-rehearsal", "1/4"]) == 2  # it says rank 0 now
    real = tmp_path / "real"
    shutil.copytree(RESULTS / "h200x1-ppo-l8" / "ds", real)
    steps = [json.loads(x) for x in (real / "steps.jsonl").read_text().splitlines()]
    steps[0]["torch_memory"] = [{"max_allocated_gib": 1.0}, {"max_allocated_gib": 2.0}]  # two processes' own
    (real / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    assert compare.main(["records", str(real), "--rank-rehearsal", "0/1"]) == 2


def test_the_committed_deepspeed_runs_pass_their_bounds(root: Path) -> None:
    """check-bounds holds both committed DeepSpeed rehearsals; their bounds cover the phases named
    like verl's (the loop's probes, switch_* and repeat_*, are DeepSpeed-only and unbounded) and say
    that they are a rank's and the DeepSpeed side's."""
    import yaml
    from verl_recipes.cli import main
    from verl_recipes.measure.bounds import BOUNDED_PHASES
    from verl_recipes.recipe.metadata import get_recipe

    assert main(["check-bounds", "verl-vs-deepspeed"]) == 0
    recipe = get_recipe("verl-vs-deepspeed")
    assert {f"expected/{n}.yaml" for n in REHEARSED} <= set(recipe.expected)
    for name, rank in REHEARSED.items():
        doc = yaml.safe_load((recipe.dir / "expected" / f"{name}.yaml").read_text())
        assert doc["source_runs"] == [f"results/{name}"]
        assert doc["rank_rehearsal"] == {"rank": rank[0], "world": rank[1]}
        assert doc["provenance"][f"results/{name}"]["backend"] == "deepspeed"
        phases = set(doc["bounds"]["memory_gib"])
        assert {"gen", "old_log_prob", "ref", "values", "update_critic", "update_actor"} <= phases
        assert phases <= set(BOUNDED_PHASES)
        assert doc["bounds"]["step_time_s"] and doc["bounds"]["throughput_tok_s"] and doc["bounds"]["host_gib"]


@pytest.mark.slow
def test_a_rehearsed_rank_runs_the_loop_and_its_records_make_a_report(tiny: dict[str, Path], tmp_path: Path) -> None:
    """`compare.py ds` as rank 0 of 2 on a CPU (DeepSpeed ZeRO-3 over the fake group): every output
    says it is a rehearsal, and `verl-recipes report` on the folder gives a summary whose phases are
    the loop's intervals, headed by the rank line."""
    pytest.importorskip("deepspeed")
    from verl_recipes.cli import main
    from verl_recipes.measure.report import rank_line

    out = tmp_path / "ds"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VERL_RECIPES_RANK_REHEARSAL": "0/2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "common"), env.get("PYTHONPATH", "")])
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "1", str(RECIPE / "compare.py"), "ds"]
    cmd += ["--backend", "deepspeed", "--device", "cpu", *_ds_args(tiny, out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_rehearsal_labels(out, (0, 2))
    res = json.loads((out / "results.json").read_text())
    assert [s["tokens"] for s in res["ds"]["steps"]] == [4 * 48] * 3  # the rank's 4 of the 8 prompts
    raw = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert all(len(s["torch_memory"]) == 1 for s in raw)  # as written, not only as read back
    assert (out / "model_config.json").is_file()  # the checkpoint's config: a truncated model names its run
    assert main(["report", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    _check_summary_phases(summary, res["ds"]["steps"])
    assert (out / "report.md").read_text().splitlines()[2] == f"- {rank_line(RankSpec(0, 2))}"


def test_run_both_refuses_a_bad_gpu_count_before_doing_anything(root: Path, tmp_path: Path) -> None:
    r = _run_both(root, tmp_path / "out", "two")
    assert r.returncode == 2 and "NPROC must be a positive number" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_rehearsed_rank_partitions_zero3_to_its_share_and_trains(tiny: dict[str, Path]) -> None:
    """The DeepSpeed side of a rank rehearsal: one process as rank 0 of 2 (PyTorch's fake process
    group, started by `Dist.from_env` from `VERL_RECIPES_RANK_REHEARSAL`), the recipe's own ZeRO-3
    config and engine on the baseline's actor. ZeRO-3 holds half of every parameter, a step trains,
    and the rank writes the run's files. Rank 0 is the one to rehearse: DeepSpeed checks that the
    ranks agree by broadcasting from rank 0, which a fake group does not send, so rank 1 stops
    there ("disagreement on list length between rank0 and rank1")."""
    pytest.importorskip("deepspeed")
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(RECIPE)!r})
from ds_ppo import engines, losses
from ds_ppo.harness import cpu_collectives_over_gloo
from ds_ppo.timing import Dist
d = Dist.from_env("cpu")
import deepspeed
cpu_collectives_over_gloo()
deepspeed.init_distributed(dist_backend="gloo")
hp = losses.PPOHyper.from_verl_defaults()
cfg = engines.ds_config(engines.load_ds_config(), 1, 1, d.world)
cfg.pop("bf16", None)
model = engines.load_actor({str(tiny["model"])!r}, torch.float32, grad_ckpt="off")
engine = engines.deepspeed_trained(model, 1e-3, 0.0, hp.betas, cfg)
w = model.model.layers[0].mlp.up_proj.weight
ids = torch.randint(0, 64, (1, 8))
loss = engine.engine(ids, labels=ids).loss
engine.engine.backward(loss)
engine.engine.step()
print(json.dumps({{"world": d.world, "rank": d.rank, "writes": d.writes, "local": w.ds_tensor.numel(),
                  "full": w.ds_numel, "loss": float(loss.detach()),
                  "backend": torch.distributed.get_backend(), "label": d.rank_rehearsal,
                  "gathered": d.gather_objects({{"max_allocated_gib": 1.0}}),
                  "sum": d.sum_int(5), "job_sum": d.job_sum_int(5), "mean": d.mean_floats([0.25, 3.0])}}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "common"), "VERL_RECIPES_RANK_REHEARSAL": "0/2"}
    env.update({"DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr, proc.stderr[-3000:]  # as the baseline's CPU ranks
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["world"], got["rank"], got["writes"], got["backend"]) == (2, 0, True, "fake")
    assert got["local"] * 2 == got["full"] and math.isfinite(got["loss"])
    # the one real process answers for itself: a fake group's gather would give copies, one per rank
    assert got["label"] == {"rank": 0, "world": 2} and got["gathered"] == [{"max_allocated_gib": 1.0}]
    # a loss's token count is the job's (the rank's times the world); the rank's counts and reported
    # means are its own (a fake group's all_reduce returns them alone: no division by the world)
    assert (got["sum"], got["job_sum"], got["mean"]) == (5, 10, [0.25, 3.0])


@pytest.mark.parametrize(
    "rank", [["--rank", "2"], ["--rank"], ["--rank", "first"]], ids=["too-high", "missing", "word"]
)
def test_run_both_refuses_a_bad_rank_before_doing_anything(root: Path, tmp_path: Path, rank: list[str]) -> None:
    r = _run_both(root, tmp_path / "out", "2", *rank)
    assert r.returncode == 2 and "--rank needs a rank below NPROC (2)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("side", [["--side", "both-ish"], ["--side"]], ids=["word", "missing"])
def test_run_both_refuses_a_bad_side_before_doing_anything(root: Path, tmp_path: Path, side: list[str]) -> None:
    r = _run_both(root, tmp_path / "out", "2", "--rank", "0", *side)
    assert r.returncode == 2 and "--side takes ds, verl or openrlhf" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_run_both_runs_openrlhf_as_the_job_itself_not_as_a_rank(root: Path, tmp_path: Path) -> None:
    """OpenRLHF is the DeepSpeed-based peer on the whole job: a rank rehearsal is verl's and the
    loop's, refused in one line before anything is made."""
    r = _run_both(root, tmp_path / "out", "2", "--rank", "0", "--side", "openrlhf")
    assert r.returncode == 2 and "--side openrlhf runs the job itself" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
