"""One PPO step of the DeepSpeed baseline, in verl's phase order and with verl's phase names.

verl 0.9.1's trainer (trainer/ppo/ray_trainer.py, `fit`) runs: gen, reward, old_log_prob, ref,
values, adv, update_critic, update_actor. This loop runs the same phases on the same data so that
`timing_s/<phase>` means the same thing on both sides:

- gen: the actor samples `response_len` tokens per prompt with HF `generate` under ZeRO-3
  (`synced_gpus` when there are several ranks; EOS suppressed by min_new_tokens = max_new_tokens,
  like verl's `rollout.ignore_eos`); temperature/top-p/top-k are verl's rollout defaults;
- reward: the rule reward verl's side uses (verl_recipes.workload.reward.compute_score), on the last token;
- old_log_prob / ref / values: forward passes (no grad) of actor, reference, critic;
- adv: KL penalty in the reward (when a reference is used) and GAE over the *global* batch (all
  ranks' rows gathered, as verl's driver computes it), then each rank keeps its rows;
- update_critic, update_actor: one epoch over mini-batches, micro-batches accumulated, one
  optimizer step per mini-batch, losses normalised as verl's (losses.py).

Switch latency (the seed's "actor/critic switching latency", which it does not define). Here:
  actor -> critic = from the end of the last actor operation before the critic is needed
  (old_log_prob, synchronized on every rank) until a trivial critic forward (1 token, no grad)
  has completed on every rank; critic -> actor = from the end of update_critic to a trivial
  actor forward completing. Under ZeRO-3 there is no model state to swap: a model's first op
  after the other model ran must re-gather all its sharded weights (the all-gather of every layer
  that any forward does), plus the train/eval mode change. Because every ZeRO-3 forward pays
  that gather, the same trivial forward is timed again right away on the same model
  (`repeat_*_forward`): switch minus repeat is what switching itself costs, beyond the per-forward
  gather. The probes are excluded from the step time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ds_ppo import losses
from ds_ppo.engines import Engine
from ds_ppo.timing import Dist, PhaseClock

PROBES = ("switch_actor_to_critic", "repeat_critic_forward", "switch_critic_to_actor", "repeat_actor_forward")


@dataclass(frozen=True)
class Shapes:
    """Per-GPU sizes of the loop; see workload.Workload for their meaning."""

    prompt_len: int
    response_len: int
    mini_batch_per_gpu: int
    train_micro: int
    infer_micro: int
    gen_micro: int = 0


@dataclass
class StepBatch:
    """This rank's prompts of one step."""

    prompt_ids: torch.Tensor  # (b, prompt_len), left-padded
    prompt_mask: torch.Tensor
    ground_truths: list[str]
    data_sources: list[str]


def _score_fn() -> Callable[..., float]:
    from verl_recipes.workload.reward import compute_score

    return compute_score


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class PPOLoop:
    """Runs PPO steps on given engines; knows nothing about how they were built."""

    def __init__(
        self,
        actor: Engine,
        critic: Engine,
        ref: Engine | None,
        tokenizer: Any,
        hp: losses.PPOHyper,
        shapes: Shapes,
        d: Dist,
        score_fn: Callable[..., float] | None = None,
    ) -> None:
        from transformers import GenerationConfig

        self.actor, self.critic, self.ref = actor, critic, ref
        self.tokenizer, self.hp, self.shapes, self.dist = tokenizer, hp, shapes, d
        self.score_fn = score_fn or _score_fn()
        self.actor_cfg = losses.actor_config(hp)
        gen_defaults = getattr(actor.module, "generation_config", None)
        eos = getattr(gen_defaults, "eos_token_id", None) or tokenizer.eos_token_id
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
        )
        self.gen_config = GenerationConfig(
            do_sample=True,
            temperature=hp.temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=shapes.response_len,
            min_new_tokens=shapes.response_len,
            eos_token_id=eos,
            pad_token_id=pad,
            use_cache=True,
        )
        self.probe_ids = torch.full((1, 1), int(pad), dtype=torch.long, device=d.device)

    # -- phases --------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.actor.eval()
        size = self.shapes.gen_micro or ids.shape[0]
        out = []
        for sl in _chunks(ids.shape[0], size):
            seq = self.actor.module.generate(  # type: ignore[operator]
                input_ids=ids[sl],
                attention_mask=mask[sl],
                generation_config=self.gen_config,
                synced_gpus=self.dist.world > 1,
            )
            resp = seq[:, ids.shape[1] :]
            if resp.shape[1] != self.shapes.response_len:
                raise RuntimeError(f"generate returned {resp.shape[1]} tokens, expected {self.shapes.response_len}")
            out.append(resp)
        return torch.cat(out)

    def scores(self, responses: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(responses.tolist(), skip_special_tokens=True)
        vals = [
            self.score_fn(data_source=ds, solution_str=t, ground_truth=gt)
            for t, gt, ds in zip(texts, batch.ground_truths, batch.data_sources, strict=True)
        ]
        return torch.tensor(vals, dtype=torch.float32, device=responses.device)

    def _logprobs(self, engine: Engine, seq: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        r = self.shapes.response_len
        out = engine(input_ids=seq, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=r + 1)
        return losses.response_logprobs(out.logits, seq, r, self.hp.temperature)

    def _values(self, seq: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.critic(input_ids=seq, attention_mask=mask, position_ids=pos, use_cache=False)
        return losses.response_values(out.logits, self.shapes.response_len)

    @torch.no_grad()
    def forward_all(
        self,
        fn: Callable[..., torch.Tensor],
        engine: Engine,
        seq: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
    ) -> torch.Tensor:
        engine.eval()
        return torch.cat([fn(seq[s], mask[s], pos[s]) for s in _chunks(seq.shape[0], self.shapes.infer_micro)])

    @torch.no_grad()
    def probe(self, engine: Engine) -> None:
        """The trivial forward of the switch-latency definition (module docstring)."""
        engine.eval()
        engine(input_ids=self.probe_ids, use_cache=False)

    def update_critic(
        self,
        seq: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        values: torch.Tensor,
        returns: torch.Tensor,
        resp_mask: torch.Tensor,
    ) -> dict[str, float]:
        self.critic.train()
        mb_losses, clipfracs, norms = [], [], []
        for mb in _chunks(seq.shape[0], self.shapes.mini_batch_per_gpu):
            ntok = self.dist.job_sum_int(int(resp_mask[mb].sum()))
            total = 0.0
            for s in _chunks(mb.stop - mb.start, self.shapes.train_micro):
                s = slice(mb.start + s.start, mb.start + s.stop)
                vpreds = self._values(seq[s], mask[s], pos[s])
                loss, m = losses.value_loss(
                    self.hp,
                    vpreds,
                    values[s],
                    returns[s],
                    resp_mask[s],
                    batch_num_tokens=ntok,
                    dp_size=self.dist.world,
                )
                self.critic.backward(loss)
                self.critic.step()
                total += loss.item()
                clipfracs.append(m["critic/vf_clipfrac"])
            mb_losses.append(total)
            norms.append(self.critic.grad_norm)
        loss_mean, clip_mean = self.dist.mean_floats([_mean(mb_losses), _mean(clipfracs)])
        return {
            "critic/vf_loss": loss_mean,
            "critic/vf_clipfrac": clip_mean,
            "critic/grad_norm": _mean_opt(norms),
        }

    def update_actor(
        self,
        seq: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        old: torch.Tensor,
        adv: torch.Tensor,
        resp_mask: torch.Tensor,
    ) -> dict[str, float]:
        self.actor.train()
        mb_losses, norms = [], []
        pg: dict[str, list[float]] = {}
        for mb in _chunks(seq.shape[0], self.shapes.mini_batch_per_gpu):
            ntok = self.dist.job_sum_int(int(resp_mask[mb].sum()))
            total = 0.0
            for s in _chunks(mb.stop - mb.start, self.shapes.train_micro):
                s = slice(mb.start + s.start, mb.start + s.stop)
                logp = self._logprobs(self.actor, seq[s], mask[s], pos[s])
                loss, m = losses.policy_loss(
                    self.actor_cfg,
                    old[s],
                    logp,
                    adv[s],
                    resp_mask[s],
                    batch_num_tokens=ntok,
                    dp_size=self.dist.world,
                )
                self.actor.backward(loss)
                self.actor.step()
                total += loss.item()
                for k, v in m.items():
                    pg.setdefault(k, []).append(float(v))
            mb_losses.append(total)
            norms.append(self.actor.grad_norm)
        keys = sorted(pg)
        means = self.dist.mean_floats([_mean(mb_losses)] + [_mean(pg[k]) for k in keys])
        out = {"actor/pg_loss": means[0], "actor/grad_norm": _mean_opt(norms)}
        out.update(zip(keys, means[1:], strict=True))
        return out

    # -- the step ------------------------------------------------------------------------------

    def step(self, batch: StepBatch) -> dict[str, Any]:
        """One PPO step; returns phase seconds (max over ranks), step seconds, counts and losses."""
        clock, d = PhaseClock(self.dist), self.dist
        if clock.cuda:
            torch.cuda.reset_peak_memory_stats(d.device)
        d.barrier()
        clock.sync()
        w0, p0 = time.time(), time.perf_counter()
        ids, pmask = batch.prompt_ids.to(d.device), batch.prompt_mask.to(d.device)
        metrics: dict[str, float] = {}

        with clock.phase("gen"):
            responses = self.generate(ids, pmask)
        seq = torch.cat([ids, responses], dim=1)
        resp_mask = torch.ones_like(responses)  # fixed lengths: every response token is valid
        mask = torch.cat([pmask, resp_mask], dim=1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with clock.phase("reward"):
            token_scores = losses.outcome_scores(self.scores(responses, batch), resp_mask)
        with clock.phase("old_log_prob"):
            old = self.forward_all(lambda *a: self._logprobs(self.actor, *a), self.actor, seq, mask, pos)
        with clock.phase("switch_actor_to_critic"):
            self.probe(self.critic)
        with clock.phase("repeat_critic_forward"):
            self.probe(self.critic)
        ref = None
        if self.ref is not None:
            ref_engine = self.ref
            with clock.phase("ref"):
                ref = self.forward_all(lambda *a: self._logprobs(ref_engine, *a), ref_engine, seq, mask, pos)
        with clock.phase("values"):
            values = self.forward_all(self._values, self.critic, seq, mask, pos)
        with clock.phase("adv"):
            g = d.gather_rows
            g_scores, g_mask, g_values = g(token_scores), g(resp_mask), g(values)
            if ref is not None:
                rewards, kl_metrics = losses.kl_in_reward(g_scores, g(old), g(ref), g_mask, self.hp)
                metrics.update(kl_metrics)
            else:
                rewards = g_scores
            g_adv, g_ret = losses.advantages_returns(rewards, g_values, g_mask, self.hp)
            mine = slice(d.rank * seq.shape[0], (d.rank + 1) * seq.shape[0])
            adv, returns = g_adv[mine], g_ret[mine]
            metrics["critic/score/mean"] = float(g_scores.sum(-1).mean())
        with clock.phase("update_critic"):
            metrics.update(self.update_critic(seq, mask, pos, values, returns, resp_mask))
        with clock.phase("switch_critic_to_actor"):
            self.probe(self.actor)
        with clock.phase("repeat_actor_forward"):
            self.probe(self.actor)
        with clock.phase("update_actor"):
            metrics.update(self.update_actor(seq, mask, pos, old, adv, resp_mask))
        clock.sync()
        wall = time.perf_counter() - p0
        w1 = time.time()

        names = sorted(clock.seconds)
        maxed = d.max_floats(
            [clock.seconds[n] for n in names] + [wall - sum(clock.seconds.get(p, 0.0) for p in PROBES)]
        )
        timing = dict(zip(names, maxed[:-1], strict=True))
        return {
            "timing_s": timing,
            "step_s": maxed[-1],
            "tokens": d.sum_int(int(mask.sum())),
            "response_tokens": d.sum_int(int(resp_mask.sum())),
            "metrics": metrics,
            "torch_memory": d.gather_objects(_torch_memory(d.device)),
            "intervals": clock.intervals,
            "wall": (w0, w1),
        }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _mean_opt(xs: list[float | None]) -> float:
    vals = [x for x in xs if x is not None]
    return _mean(vals)


def _torch_memory(device: torch.device) -> dict[str, float] | None:
    """This rank's torch allocator peaks in GiB since the step began (None on a CPU)."""
    if device.type != "cuda":
        return None
    gib = 1024**3
    return {
        "max_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
        "max_reserved_gib": torch.cuda.max_memory_reserved(device) / gib,
    }
