"""The rule reward for the embedded arithmetic dataset (`verl_recipes.workload.dataset`).

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
"""

from __future__ import annotations

import re
from typing import Any

_MARKED = re.compile(r"####\s*\$?\s*(-?[\d,]*\d)")
_NUMBER = re.compile(r"-?\d[\d,]*")
# Only the tail is searched, as verl's GSM8K scorer does: a long ramble cannot make matching slow.
_TAIL_CHARS = 300


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
