"""The rule rewards: the embedded arithmetic dataset's (`verl_recipes.workload.dataset`), the
default, and a text reward a random model can score on from its first step.

verl 0.9.1 loads a custom reward function from the trainer config group `reward` (the
top-level `custom_reward_function` group is legacy and `main_ppo` no longer reads it):

    reward.custom_reward_function.path=pkg://verl_recipes.workload.reward
    reward.custom_reward_function.name=compute_score

`verl.trainer.ppo.reward.get_custom_reward_fn` imports it with
`verl.utils.import_utils.load_extern_object`, which accepts `pkg://<module>` (an installed
module, as here) or a file path. Because this module uses only the standard library, the file
path of this file works too, on hosts where verl_recipes is not installed in the Ray workers.
The naive reward manager then calls it once per response with keyword arguments
`data_source`, `solution_str` (the decoded response), `ground_truth` (the row's
`reward_model.ground_truth`) and `extra_info`, plus anything under
`reward.custom_reward_function.reward_kwargs`; a float return is logged as `acc`.

The launcher sets the path; `name` is verl's default `compute_score` (the arithmetic) unless a
recipe layer names another function here. `compute_text_score` is the one a random model scores
on: the synthetic tokenizer (`verl_recipes.workload.synth`) learns a few thousand BPE tokens and
fills the rest of the vocabulary with inert ids that decode as `<|reserved_N|>`, so a random
model's answer is mostly filler with a few real tokens (4,096 of Qwen2's 151,936 ids: 2.7% of a
uniform draw), and the share of real text is non-zero from the first step, varies between the
answers of one prompt (GRPO's signal) and can rise to 1. The arithmetic reward stays 0 on such a
model, so no run on it shows that the loop learns.
"""

from __future__ import annotations

import re
from typing import Any

_MARKED = re.compile(r"####\s*\$?\s*(-?[\d,]*\d)")
_NUMBER = re.compile(r"-?\d[\d,]*")
# Only the tail is searched, as verl's GSM8K scorer does: a long ramble cannot make matching slow.
_TAIL_CHARS = 300
#: how the synthetic tokenizer's filler ids decode (`synth.build_tokenizer`)
FILLER = re.compile(r"<\|reserved_\d+\|>")


def extract_answer(solution_str: str) -> int | None:
    """The integer after the last '####', else the last integer in the text, else None."""
    tail = solution_str[-_TAIL_CHARS:]
    marked = _MARKED.findall(tail)
    raw = marked[-1] if marked else (_NUMBER.findall(tail) or [None])[-1]
    if raw is None:
        return None
    try:
        return int(raw.replace(",", ""))
    except ValueError:
        return None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """1.0 when the response's final integer equals `ground_truth`, else 0.0.

    `data_source` and `extra_info` are accepted because verl passes them; the score depends on
    the response and the ground truth only.
    """
    answer = extract_answer(solution_str)
    try:
        expected = int(str(ground_truth).strip().replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if answer == expected else 0.0


def text_share(solution_str: str) -> float:
    """The share of the answer's characters that are text the tokenizer learned, not filler ids;
    0.0 for an empty answer (it writes no text)."""
    if not solution_str:
        return 0.0
    filler = sum(len(m) for m in FILLER.findall(solution_str))
    return 1.0 - filler / len(solution_str)


def compute_text_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """A format reward: the answer is written in the tokenizer's learned vocabulary (`text_share`).

    A trained model scores 1.0 on any answer; a random one starts near 0.01 and gains by putting
    its probability on learned tokens, which is what the learning check measures. The question
    and its ground truth play no part.
    """
    return text_share(solution_str)
