"""Which verl 0.9.1 config keys the planner reads, and which change neither GPU memory nor host RAM.

A verl job as its users write it sets dozens of keys (`recipe.verl_command`). `plan` says, by name,
each key the job sets that the memory model does not read and that is not known to leave memory
alone ("not modelled: ..."), so a key that matters is never dropped in silence. `READ` mirrors
what `predict.inputs.setup_from_config` reads (a test holds each key to verl's schema); `NO_EFFECT`
holds keys whose use in verl 0.9.1 is an optimizer coefficient, a loss term on tensors the step
holds anyway, a name, a schedule or a validation/checkpoint frequency.
"""

from __future__ import annotations

from collections.abc import Iterable

_A, _R, _M, _F = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.model",
    "actor_rollout_ref.ref",
)


def _engine(prefix: str) -> tuple[str, ...]:
    return tuple(
        f"{prefix}.{k}"
        for k in (
            "model_dtype",
            "param_offload",
            "optimizer_offload",
            "offload_policy",
            "ulysses_sequence_parallel_size",
        )
    )


#: keys `predict.inputs` reads (a trailing "." is a prefix)
READ: tuple[str, ...] = (
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "critic.enable",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "reward.num_workers",
    "reward_model.num_workers",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units",
    *(
        f"{_A}.{k}"
        for k in (
            "strategy",
            "use_dynamic_bsz",
            "ppo_max_token_len_per_gpu",
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "use_kl_loss",
            "use_torch_compile",
            "ulysses_sequence_parallel_size",
        )
    ),
    *_engine(f"{_A}.fsdp_config"),
    f"{_A}.megatron.",
    *(
        f"{_R}.{k}"
        for k in (
            "name",
            "n",
            "tensor_model_parallel_size",
            "data_parallel_size",
            "pipeline_model_parallel_size",
            "gpu_memory_utilization",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "free_cache_engine",
            "enforce_eager",
            "dtype",
            "load_format",
            "layered_summon",
            "log_prob_micro_batch_size_per_gpu",
            "log_prob_max_token_len_per_gpu",
            "agent.num_workers",
            "checkpoint_engine.update_weights_bucket_megabytes",
            "engine_kwargs.vllm.distributed_executor_backend",
        )
    ),
    *(
        f"{_M}.{k}"
        for k in (
            "lora_rank",
            "target_modules",
            "enable_gradient_checkpointing",
            "use_remove_padding",
            "override_config.attn_implementation",
            "lora_adapter_path",
            "lora.merge",
        )
    ),
    *(
        f"{_F}.{k}"
        for k in (
            "strategy",
            "log_prob_use_dynamic_bsz",
            "log_prob_micro_batch_size_per_gpu",
            "log_prob_max_token_len_per_gpu",
            "ulysses_sequence_parallel_size",
        )
    ),
    *_engine(f"{_F}.fsdp_config"),
    f"{_F}.megatron.",
    *(
        f"critic.{k}"
        for k in (
            "strategy",
            "use_dynamic_bsz",
            "ppo_micro_batch_size_per_gpu",
            "forward_micro_batch_size_per_gpu",
            "ppo_max_token_len_per_gpu",
            "forward_max_token_len_per_gpu",
            "ulysses_sequence_parallel_size",
            "model.lora_rank",
            "model.target_modules",
            "model.enable_gradient_checkpointing",
            "model.use_remove_padding",
            "model.override_config.attn_implementation",
        )
    ),
    *_engine("critic.fsdp"),
    "critic.megatron.",
)

#: keys that change neither GPU memory nor host RAM in verl 0.9.1 (a trailing "." is a prefix)
NO_EFFECT: tuple[str, ...] = (
    f"{_A}.optim.",  # learning rate, warm-up, schedule: scalars of the optimizer it holds anyway
    "critic.optim.",
    f"{_A}.kl_loss_coef",
    f"{_A}.kl_loss_type",  # the KL term on the log-probs the update holds anyway
    f"{_A}.entropy_coeff",
    f"{_A}.clip_ratio",
    f"{_A}.clip_ratio_low",
    f"{_A}.clip_ratio_high",
    f"{_A}.clip_ratio_c",
    f"{_A}.loss_agg_mode",
    f"{_A}.grad_clip",
    f"{_A}.ppo_epochs",
    f"{_A}.shuffle",
    "critic.grad_clip",
    "critic.cliprange_value",
    "critic.ppo_epochs",
    "algorithm.kl_ctrl.",
    "algorithm.kl_penalty",
    "algorithm.gamma",
    "algorithm.lam",
    "algorithm.norm_adv_by_std_in_grpo",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.critic_warmup",
    "trainer.resume_mode",
    "trainer.log_val_generations",
    "data.filter_overlong_prompts",
    "data.truncation",
    "data.shuffle",
    "data.return_raw_chat",  # the agent loop reads raw chat either way
    "data.seed",
    f"{_M}.lora_alpha",
    f"{_M}.trust_remote_code",
    f"{_R}.temperature",
    f"{_R}.top_p",
    f"{_R}.top_k",
    f"{_R}.mode",  # verl 0.9.1's rollout is the asynchronous server whatever this says
    f"{_R}.val_kwargs.",
)


def _matches(key: str, table: Iterable[str]) -> bool:
    return any(key == t or (t.endswith(".") and key.startswith(t)) for t in table)


def not_modelled(keys: Iterable[str], mapped: Iterable[str] = ()) -> list[str]:
    """The keys of `keys` the planner neither reads nor knows to leave memory alone, in order;
    `mapped` keys (the launcher's: paths, layout, loggers, the reward) are said elsewhere."""
    skip = set(mapped)
    return [k for k in keys if k not in skip and not _matches(k, READ) and not _matches(k, NO_EFFECT)]
