"""The workload's reward (`verl_recipes.workload.reward.compute_score`) in each peer's calling form.

verl calls compute_score once per answer with the row's ground truth. TRL calls a reward function
once per batch with the completions and every other dataset column as keyword lists
(`trl_reward`, named on its command line as `--reward_funcs verl_recipes.peers.rewards.trl_reward`).
OpenRLHF loads a Python file given as `--reward.remote_url FILE.py` and calls its `reward_func`
with the decoded prompt-and-answer texts, the prompts and the labels (`reward_func`; it scores the
answer only, the query with its prompt cut off). The score is the same function's in all three.

This file is also loaded by file path (OpenRLHF's loader), in OpenRLHF's Ray workers: it imports
only the standard library and the reward at load time, and torch where OpenRLHF needs tensors.
"""

from __future__ import annotations

from typing import Any

from verl_recipes.workload.reward import compute_score

DATA_SOURCE = "verl_recipes/arith"


def _text(completion: Any) -> str:
    """A TRL completion as text: a string, or (conversational prompts) a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def trl_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """TRL's reward-function form: one score per completion, from the dataset's `ground_truth`."""
    return [compute_score(DATA_SOURCE, _text(c), str(g)) for c, g in zip(completions, ground_truth, strict=True)]


def answer_of(query: str, prompt: str) -> str:
    """OpenRLHF's query is the prompt and the answer decoded together: the answer alone."""
    return query[len(prompt) :] if query.startswith(prompt) else query


def scores(queries: list[str], prompts: list[str], labels: list[str]) -> list[float]:
    return [
        compute_score(DATA_SOURCE, answer_of(q, p), str(g)) for q, p, g in zip(queries, prompts, labels, strict=True)
    ]


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
    """OpenRLHF's reward-function form: `rewards` (what the advantage uses) and `scores` (what it
    logs and filters on) as tensors, one per query."""
    import torch

    got = torch.tensor(scores(queries, prompts, labels), dtype=torch.float32)
    return {"rewards": got, "scores": got, "extra_logs": {}}
