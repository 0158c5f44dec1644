"""The workload both sides of the comparison run, and how to give verl the same one.

Why prompts are made exactly `prompt_len` tokens long: the seed fixes "sequence length 1024", and
tokens/s is only comparable when both sides process the same tokens. Arithmetic prompts are ~40
tokens; padding them to 512 would make the DeepSpeed loop compute over pad tokens that vLLM never
sees, and verl counts only real tokens (`perf/total_num_tokens` sums the attention mask). So
`write_fixed_parquet` grows each prompt's user message with a neutral filler until the chat-
templated prompt is exactly `prompt_len` tokens, the way verl's agent loop tokenizes it
(`apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`). Both sides then read
that parquet and see identical token ids; the response length is fixed by ignoring EOS.

Why a memory pre-flight: ZeRO-3 with bf16 and AdamW keeps 16 bytes per trained parameter
(bf16 weight and gradient, fp32 master, Adam m and v) sharded over the GPUs, 2 bytes per frozen
reference parameter. For Qwen2-7B that is 113 GiB (actor) + 105 GiB (critic) + 14 GiB (reference):
more than one H200 holds. Failing in one second with that arithmetic beats an OOM after loading.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
# ZeRO-3, bf16 mixed precision, AdamW: bf16 param + bf16 grad + fp32 master + Adam m + Adam v.
TRAINED_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4
FROZEN_BYTES_PER_PARAM = 2
# Filler units tried in order; the first that lands on the exact length wins. Each is usually one
# token in a byte-level BPE; the search does not rely on it.
FILLER_UNITS = (" .", " x", " -", " 0", " a")


@dataclass(frozen=True)
class Workload:
    """One PPO workload, identical on both sides. Sizes are global (all GPUs) unless `_per_gpu`.

    mini_batch: prompts per optimizer step (verl's ppo_mini_batch_size); batch/mini_batch optimizer
    steps per model per PPO step. train_micro / infer_micro: sequences per GPU per forward in the
    updates / in the log-prob and value passes. gen_micro: sequences per GPU per generate() call;
    0 = the whole per-GPU batch in one call (fastest: a decode step costs about the same for 8 or
    64 sequences, because ZeRO-3 gathers all weights every step).
    """

    model: str
    data: str
    prompt_len: int = 512
    response_len: int = 512
    batch: int = 128
    mini_batch: int = 32
    train_micro_per_gpu: int = 4
    infer_micro_per_gpu: int = 8
    gen_micro_per_gpu: int = 0
    warmup_steps: int = 2
    measured_steps: int = 5
    use_ref: bool = True
    seed: int = 1

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.measured_steps

    @property
    def tokens_per_step(self) -> int:
        """Prompt + response tokens of one PPO step (the seed's token)."""
        return self.batch * (self.prompt_len + self.response_len)

    def check(self, world: int) -> None:
        """Raise ValueError naming the first size that does not divide, for `world` GPUs."""
        if min(self.prompt_len, self.response_len, self.batch, self.mini_batch) < 1:
            raise ValueError("prompt_len, response_len, batch and mini_batch must be >= 1")
        if self.warmup_steps < 0 or self.measured_steps < 1:
            raise ValueError("need warmup_steps >= 0 and measured_steps >= 1")
        if self.batch % self.mini_batch:
            raise ValueError(f"--batch {self.batch} must be a multiple of --mini-batch {self.mini_batch}")
        if self.mini_batch % world:
            raise ValueError(f"--mini-batch {self.mini_batch} must be a multiple of the {world} GPUs")
        per_gpu = self.mini_batch // world
        if per_gpu % self.train_micro_per_gpu:
            raise ValueError(
                f"mini-batch per GPU ({per_gpu}) must be a multiple of --train-micro {self.train_micro_per_gpu}"
            )
        local = self.batch // world
        if self.gen_micro_per_gpu and local % self.gen_micro_per_gpu:
            raise ValueError(f"batch per GPU ({local}) must be a multiple of --gen-micro {self.gen_micro_per_gpu}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Prompts


@dataclass(frozen=True)
class PromptRow:
    """One dataset row as the loop needs it: chat messages and what the reward compares with."""

    messages: list[dict[str, str]]
    ground_truth: str
    data_source: str


def _plain(obj: Any) -> Any:
    """numpy arrays and pyarrow structs (as pandas returns them) into lists and dicts."""
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):
        obj = obj.tolist()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def read_rows(path: str | Path, limit: int | None = None) -> list[PromptRow]:
    """Rows of a verl RL parquet (`prompt`, `reward_model.ground_truth`, `data_source`), in order."""
    import pandas as pd

    df = pd.read_parquet(path)
    if limit is not None:
        df = df.head(limit)
    rows = []
    for rec in df.to_dict("records"):
        rm = _plain(rec.get("reward_model") or {})
        rows.append(
            PromptRow(
                messages=[dict(m) for m in _plain(rec["prompt"])],
                ground_truth=str(rm.get("ground_truth", "")),
                data_source=str(rec.get("data_source", "")),
            )
        )
    return rows


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids exactly as verl's agent loop makes them (verl.utils.tokenizer)."""
    from verl.utils.tokenizer import normalize_token_ids

    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return normalize_token_ids(out)


def _with_filler(messages: list[dict[str, str]], unit: str, n: int) -> list[dict[str, str]]:
    """The messages with `n` filler units and a newline put before the last user message's content."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            if n:
                m["content"] = (unit * n).lstrip() + "\n" + m["content"]
            break
    else:
        raise ValueError("a prompt has no user message to lengthen")
    return out


def fit_messages(tokenizer: Any, messages: list[dict[str, str]], length: int) -> list[dict[str, str]] | None:
    """The messages lengthened to exactly `length` prompt tokens, or None when no filler fits.

    For each filler unit, the token count is non-decreasing in the number of repetitions n, so a
    bisection finds the smallest n reaching `length`; it fits only if that count is exact.
    """
    base = len(chat_ids(tokenizer, messages))
    if base == length:
        return messages
    if base > length:
        return None
    for unit in FILLER_UNITS:

        def count(n: int, unit: str = unit) -> int:
            return len(chat_ids(tokenizer, _with_filler(messages, unit, n)))

        lo, hi = 0, max(1, length - base)
        while count(hi) < length:
            lo, hi = hi, hi * 2
            if hi > 64 * length:
                break
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if count(mid) < length:
                    lo = mid
                else:
                    hi = mid
            if count(hi) == length:
                return _with_filler(messages, unit, hi)
    return None


def write_fixed_parquet(
    src: str | Path, tokenizer: Any, length: int, out: str | Path, limit: int | None = None
) -> dict[str, int]:
    """Copy the first `limit` rows of `src` to `out` with every prompt exactly `length` tokens.

    Rows that cannot be fitted (longer than `length`, or no filler lands exactly) are dropped and
    counted. Every other column is kept, so verl's reward manager reads the same ground truth.
    """
    import pandas as pd

    df = pd.read_parquet(src)
    if limit is not None:
        df = df.head(limit)
    kept, dropped = [], 0
    for rec in df.to_dict("records"):
        messages = [dict(m) for m in _plain(rec["prompt"])]
        fitted = fit_messages(tokenizer, messages, length)
        if fitted is None:
            dropped += 1
            continue
        kept.append({**{k: _plain(v) for k, v in rec.items()}, "prompt": fitted})
    if not kept:
        raise ValueError(f"no prompt of {src} could be made exactly {length} tokens long")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(kept).to_parquet(out, index=False)
    return {"rows": len(kept), "dropped": dropped, "prompt_len": length}


def encode_prompts(token_lists: list[list[int]], length: int, pad_id: int) -> tuple[Any, Any]:
    """(input_ids, attention_mask) of shape (n, length): left-padded, or left-truncated.

    Left padding is what HF generate needs for a batch; with a `write_fixed_parquet` file nothing
    is padded or truncated.
    """
    import torch

    ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), length), dtype=torch.long)
    for i, toks in enumerate(token_lists):
        toks = toks[-length:]
        ids[i, length - len(toks) :] = torch.tensor(toks, dtype=torch.long)
        mask[i, length - len(toks) :] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------
# Memory pre-flight


@dataclass(frozen=True)
class ParamCounts:
    actor: int
    critic: int
    ref: int


def param_counts(model_dir: str | Path) -> ParamCounts:
    """Parameter counts of actor (causal LM), critic (token classification, 1 label) and reference.

    Built on the meta device from the checkpoint's config.json: no weights are read.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        actor = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
        ccfg = AutoConfig.from_pretrained(model_dir, num_labels=1)
        critic = sum(p.numel() for p in AutoModelForTokenClassification.from_config(ccfg).parameters())
    return ParamCounts(actor=actor, critic=critic, ref=actor)


def zero3_state_bytes_per_gpu(counts: ParamCounts, world: int, use_ref: bool) -> int:
    """Model-state bytes per GPU under ZeRO-3 (no activations, KV cache or gather buffers)."""
    total = TRAINED_BYTES_PER_PARAM * (counts.actor + counts.critic)
    if use_ref:
        total += FROZEN_BYTES_PER_PARAM * counts.ref
    return -(-total // world)


def memory_preflight(counts: ParamCounts, world: int, use_ref: bool, gpu_bytes: int, headroom_gib: float) -> str | None:
    """None if the model states leave `headroom_gib` per GPU, else a one-line reason and the fix."""
    need = zero3_state_bytes_per_gpu(counts, world, use_ref)
    if need + headroom_gib * GIB <= gpu_bytes:
        return None
    min_gpus = -(-zero3_state_bytes_per_gpu(counts, 1, use_ref) // int(gpu_bytes - headroom_gib * GIB))
    return (
        f"ZeRO-3 model states need {need / GIB:.1f} GiB per GPU on {world} GPU(s) "
        f"(actor {counts.actor:,} + critic {counts.critic:,} params x {TRAINED_BYTES_PER_PARAM} B"
        + (f", reference {counts.ref:,} x {FROZEN_BYTES_PER_PARAM} B" if use_ref else "")
        + f") and {headroom_gib:g} GiB are kept for activations, of {gpu_bytes / GIB:.1f} GiB: "
        f"use >= {max(min_gpus, world + 1)} GPUs or a checkpoint with fewer layers "
        "(verl-recipes synth-model --layers N), or pass --skip-memory-check"
    )


# ---------------------------------------------------------------------------------------------
# The verl side


def verl_overrides(w: Workload, n_gpus: int, kl_coef: float | None = None) -> list[str]:
    """Hydra overrides of verl's ppo_trainer that define this workload (not its parallelism).

    Layer them on the recipe's config.yaml. They fix what the DeepSpeed loop also fixes: the data
    (no shuffle, so both sides draw the same prompts in the same order), lengths, batch and
    mini-batch, EOS ignored, GAE, the KL penalty in the reward when a reference model is used,
    the number of steps, and a JSONL metrics file for `compare.py report --verl`.
    """
    o = [
        f"data.train_files={w.data}",
        f"data.val_files={w.data}",
        "data.shuffle=False",
        f"data.train_batch_size={w.batch}",
        f"data.max_prompt_length={w.prompt_len}",
        f"data.max_response_length={w.response_len}",
        f"actor_rollout_ref.model.path={w.model}",
        f"critic.model.path={w.model}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w.mini_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={w.train_micro_per_gpu}",
        f"critic.ppo_micro_batch_size_per_gpu={w.train_micro_per_gpu}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={w.infer_micro_per_gpu}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={w.infer_micro_per_gpu}",
        f"critic.forward_micro_batch_size_per_gpu={w.infer_micro_per_gpu}",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "algorithm.adv_estimator=gae",
        f"algorithm.use_kl_in_reward={w.use_ref}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        f"trainer.total_training_steps={w.steps}",
        f"trainer.n_gpus_per_node={n_gpus}",
        "trainer.nnodes=1",
        "trainer.critic_warmup=0",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
    ]
    if w.use_ref and kl_coef is not None:
        o.append(f"algorithm.kl_ctrl.kl_coef={kl_coef}")
    return o


def load_workload(path: str | Path) -> Workload:
    """A Workload from a results.json (its "workload" key) or a plain JSON dict."""
    raw = json.loads(Path(path).read_text())
    return Workload(**raw.get("workload", raw))
