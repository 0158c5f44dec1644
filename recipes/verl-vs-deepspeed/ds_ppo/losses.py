"""The PPO math of the baseline, delegated to verl's own functions.

Why delegate: a throughput comparison is only fair if both sides do the same work per token, and
a baseline with subtly different math (another clip range, per-micro-batch instead of global
token-mean normalisation, local instead of global advantage whitening) would be a different
algorithm. So nothing here re-implements PPO: GAE is `core_algos.compute_gae_advantage_return`,
the clipped policy loss is `core_algos.get_policy_loss_fn("vanilla")` called with verl's own
`ActorConfig`, the clipped value loss is `core_algos.compute_value_loss`, the KL penalty is
`core_algos.kl_penalty`, log-probs are `verl.utils.torch_functional.logprobs_from_logits`.
This module only slices model outputs into the (batch, response_len) layout those functions take
and passes the normalisation verl's FSDP engine passes (tests/test_ds_ppo.py checks both).

Normalisation, as verl 0.9.1's engine does it (workers/engine/fsdp/transformer_impl.py and
workers/utils/losses.py): each micro-batch's loss is masked_sum / batch_num_tokens * dp_size,
where batch_num_tokens counts the response tokens of the whole mini-batch on all ranks. Summed
over micro-batches and averaged over ranks by the gradient reduction, that is the token-mean over
the global mini-batch. The DeepSpeed engine therefore must not divide by the accumulation steps
again (`backward(loss, scale_wrt_gas=False)`, see engines.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_VERL_DEFAULTS = "trainer/config/_generated_ppo_trainer.yaml"


@dataclass(frozen=True)
class PPOHyper:
    """The constants of the PPO step. `from_verl_defaults()` takes every one from verl's config."""

    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    cliprange_value: float
    loss_agg_mode: str
    gamma: float
    lam: float
    kl_penalty: str
    kl_coef: float
    temperature: float
    actor_lr: float
    critic_lr: float
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float

    @classmethod
    def from_verl_defaults(cls, **overrides: Any) -> PPOHyper:
        """Defaults of the config verl's own trainer composes (`_generated_ppo_trainer.yaml`)."""
        import verl
        import yaml

        cfg = yaml.safe_load((Path(verl.__file__).parent / _VERL_DEFAULTS).read_text())
        actor = cfg["actor_rollout_ref"]["actor"]
        critic, algo = cfg["critic"], cfg["algorithm"]
        values = {
            "clip_ratio": actor["clip_ratio"],
            "clip_ratio_low": actor["clip_ratio_low"],
            "clip_ratio_high": actor["clip_ratio_high"],
            "clip_ratio_c": actor["clip_ratio_c"],
            "cliprange_value": critic["cliprange_value"],
            "loss_agg_mode": actor["loss_agg_mode"],  # the critic's interpolates the actor's
            "gamma": algo["gamma"],
            "lam": algo["lam"],
            "kl_penalty": algo["kl_penalty"],
            "kl_coef": algo["kl_ctrl"]["kl_coef"],
            "temperature": cfg["actor_rollout_ref"]["rollout"]["temperature"],
            "actor_lr": actor["optim"]["lr"],
            "critic_lr": critic["optim"]["lr"],
            "weight_decay": actor["optim"]["weight_decay"],
            "betas": tuple(actor["optim"]["betas"]),
            "grad_clip": actor["optim"]["clip_grad"],
        }
        values.update(overrides)
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def actor_config(hp: PPOHyper) -> Any:
    """verl's own ActorConfig carrying the clip constants, as `compute_policy_loss_vanilla` reads them."""
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=hp.clip_ratio,
        clip_ratio_low=hp.clip_ratio_low,
        clip_ratio_high=hp.clip_ratio_high,
        clip_ratio_c=hp.clip_ratio_c,
        loss_agg_mode=hp.loss_agg_mode,
    )


def response_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, response_len: int, temperature: float
) -> torch.Tensor:
    """Log-probs (fp32) of the response tokens: logits at position t predict token t + 1.

    `logits` may be the full sequence or only its last response_len + 1 positions
    (HF `logits_to_keep`); both end at the last token. verl divides by the rollout temperature.
    """
    from verl.utils.torch_functional import logprobs_from_logits

    resp_logits = logits[:, -response_len - 1 : -1, :].float()
    if temperature != 1.0:
        resp_logits = resp_logits / temperature
    return logprobs_from_logits(resp_logits, input_ids[:, -response_len:])


def response_values(critic_logits: torch.Tensor, response_len: int) -> torch.Tensor:
    """Values (fp32) of the response tokens from a 1-label token classifier, sliced as verl's critic."""
    return critic_logits[:, -response_len - 1 : -1, 0].float()


def outcome_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level scores: each sequence's score on its last valid response token (verl's reward manager)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    out[torch.arange(out.shape[0], device=out.device), last] = scores.float().to(out.device)
    return out


def kl_in_reward(
    token_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    hp: PPOHyper,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level rewards = scores - kl_coef * KL, as verl's `apply_kl_penalty` (fixed controller)."""
    from verl.trainer.ppo.core_algos import kl_penalty
    from verl.utils.torch_functional import masked_mean

    penalty: Any = kl_penalty  # verl annotates FloatTensor; any float tensor is what it takes
    kld = penalty(old_log_probs, ref_log_probs, kl_penalty=hp.kl_penalty) * response_mask
    rewards = token_scores - hp.kl_coef * kld
    current_kl = torch.mean(masked_mean(kld, mask=response_mask, axis=-1), dim=0).item()
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": hp.kl_coef}


def advantages_returns(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, hp: PPOHyper
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages (whitened over the batch given: pass the global batch) and returns."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    return compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=response_mask, gamma=hp.gamma, lam=hp.lam
    )


def policy_loss(
    cfg: Any,
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    batch_num_tokens: int | None,
    dp_size: int,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's vanilla clipped policy loss of one micro-batch, normalised over the global mini-batch.

    `cfg` is `actor_config(hp)`; its `global_batch_info` is set here exactly as verl's `ppo_loss`
    sets it. batch_num_tokens=None with dp_size=1 is the plain token-mean of this batch.
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    cfg.global_batch_info.update(
        dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=None, loss_scale_factor=None
    )
    fn = get_policy_loss_fn(cfg.policy_loss.get("loss_mode", "vanilla"))
    return fn(
        old_log_prob=old_log_probs,
        log_prob=log_probs,
        advantages=advantages,
        response_mask=response_mask.bool(),
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
    )


def value_loss(
    hp: PPOHyper,
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    batch_num_tokens: int | None,
    dp_size: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's clipped value loss of one micro-batch, normalised over the global mini-batch."""
    from verl.trainer.ppo.core_algos import compute_value_loss

    loss, clipfrac = compute_value_loss(
        vpreds=vpreds,
        returns=returns,
        values=values,
        response_mask=response_mask.bool(),
        cliprange_value=hp.cliprange_value,
        loss_agg_mode=hp.loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
    )
    return loss, {"critic/vf_clipfrac": clipfrac.detach().item()}
