"""The GPU layout rules of a verl job, in one place.

A job spreads `nodes x GPUs per node` ranks over tensor (TP), pipeline (PP) and context (CP)
parallel groups and data-parallel (DP) replicas: nodes x GPUs = TP x PP x CP x DP. Each rule
below is one reason a GPU host refuses a job, and each raises a one-line `RecipeError` that says
what to change, in the caller's words (`names`: the Slurm launcher says TP, the planner names
the verl key). The memory planner (`predict.inputs.check_layout`, which `train`'s pre-flight
runs) and the Slurm launcher's check (`cluster.settings.check`) both call these, so the two cannot
drift apart.

Standard library only: the Slurm launcher imports this on a host's bare python3.
"""

from __future__ import annotations

from verl_recipes import RecipeError


def positive(name: str, value: int) -> int:
    """A size or count the layout divides by: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"{name}={value}: must be a whole number of at least 1")
    return value


def data_parallel(
    nodes: int,
    gpus_per_node: int,
    sizes: tuple[int, ...],
    what: str,
    fix: str,
    nodes_word: str = "nodes",
) -> int:
    """DP from nodes x GPUs = product(sizes) x DP; a split that leaves GPUs over is refused.

    `sizes` are the model-parallel sizes (TP, PP[, CP]) and `what` names them ("TP x PP").
    """
    world = nodes * gpus_per_node
    group = 1
    for s in sizes:
        group *= s
    if world % group:
        raise RecipeError(
            f"{world} GPUs ({nodes} {nodes_word} x {gpus_per_node}) do not divide by {what} = "
            f"{' x '.join(str(s) for s in sizes)} = {group}; {fix}"
        )
    return world // group


def tp_in_node(gpus_per_node: int, tp: int, name: str = "TP") -> None:
    """A tensor-parallel group exchanges activations every layer, so it stays inside one node."""
    if tp > gpus_per_node:
        raise RecipeError(
            f"{name}={tp} exceeds the {gpus_per_node} GPUs of a node; tensor parallel must stay inside "
            f"a node: lower {name} or use nodes with more GPUs"
        )
    if gpus_per_node % tp:
        raise RecipeError(
            f"{name}={tp} does not divide the {gpus_per_node} GPUs of a node, so a tensor-parallel group "
            f"would span two nodes; use a {name} that divides the GPUs per node"
        )


def heads_over_tp(tp: int, heads: int, kv_heads: int, name: str, kv_replicated: bool) -> None:
    """TP splits attention by heads. Megatron splits query and KV heads alike; vLLM replicates KV
    heads when TP exceeds them (`kv_replicated`), so there TP may also be a multiple of them."""
    if heads % tp:
        raise RecipeError(f"{name}={tp} does not divide num_attention_heads={heads}")
    if kv_heads % tp and not (kv_replicated and tp % kv_heads == 0):
        how = "neither divides nor is a multiple of" if kv_replicated else "does not divide"
        raise RecipeError(f"{name}={tp} {how} num_key_value_heads={kv_heads}")


def layers_over_pp(pp: int, layers: int, name: str) -> None:
    """Pipeline stages hold whole decoder layers."""
    if layers % pp:
        raise RecipeError(f"{name}={pp} does not divide num_hidden_layers={layers}")


def batch_over_ranks(rows: int, minimal: int, train_batch: int, mini_batch: int) -> None:
    """verl's start-up check (`verl.utils.config.validate_config`, `ActorConfig.validate`): every
    data-parallel rank gets whole rows, and a PPO mini-batch is not larger than the batch."""
    if rows % minimal:
        raise RecipeError(
            f"data.train_batch_size x rollout.n = {rows} is not a multiple of {minimal} "
            "(verl's minimal batch: the GPUs, or Megatron DP x micro-batch); change the batch or the GPUs"
        )
    if train_batch < mini_batch:
        raise RecipeError(
            f"data.train_batch_size={train_batch} is below actor_rollout_ref.actor."
            f"ppo_mini_batch_size={mini_batch} (verl rejects it); "
            f"lower ppo_mini_batch_size to at most {train_batch}"
        )
