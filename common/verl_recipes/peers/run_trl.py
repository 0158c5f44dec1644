"""TRL's launcher: `python3 -m verl_recipes.peers.run_trl RUN_DIR`, in TRL's own environment.

It writes the workload's prompts for TRL (`peers.data`) and the environment's packages
(`peers.spec`), marks TRL's phases, and runs TRL's own GRPO script (`trl.scripts.grpo`: its
parser and its `main`) on the command line `peers.trl` composed. Nothing TRL does is changed:

- a step is one optimizer step of TRL's Trainer (one generation batch of the workload), begun and
  ended by a TrainerCallback, Transformers' own hook for watching a loop, added to the trainer
  the script builds (`Trainer.add_callback`, after GRPOTrainer's own __init__ has run);
- `score` is GRPOTrainer._generate_and_score_completions (tokenizing, generating, the reference's
  log-probs, rewards, advantages), whose output also gives the step's tokens (prompt and
  completion masks: the real tokens, as verl counts them); `gen` is VLLMGeneration.generate and
  `update_weights` VLLMGeneration.sync_weights, both inside it; `update_actor` is each of the
  step's GRPOTrainer.training_step calls (forward and backward of a micro-batch; the first one
  holds the step's `score`). The optimizer's step and TRL's logging are the step's own time.

Standard library and the package's base at load time: TRL loads inside `main`.
"""

from __future__ import annotations

import sys
from typing import Any

from verl_recipes.peers import marks
from verl_recipes.peers.spec import prepare


def _tokens(batch: dict[str, Any]) -> int:
    """The real tokens of a scored batch: prompt and completion masks (padding left out)."""
    return int(batch["prompt_mask"].sum().item() + batch["completion_mask"].sum().item())


def install(steps: marks.Steps) -> None:
    """Wrap TRL 1.16.0's step functions to write the run's phases (module docstring)."""
    from transformers import TrainerCallback
    from trl.generation.vllm_generation import VLLMGeneration
    from trl.trainer.grpo_trainer import GRPOTrainer

    class StepMarks(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.end(extra={"trl/global_step": state.global_step})

    init = marks.method(GRPOTrainer, "__init__")

    def init_then_watch(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.add_callback(StepMarks())

    GRPOTrainer.__init__ = init_then_watch

    score = marks.phase("score", steps)(marks.method(GRPOTrainer, "_generate_and_score_completions"))

    def score_and_count(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = score(self, *args, **kwargs)
        steps.add_tokens(_tokens(out))
        return out

    GRPOTrainer._generate_and_score_completions = score_and_count
    marks.wrap_method(GRPOTrainer, "training_step", "update_actor", steps)
    marks.wrap_method(VLLMGeneration, "generate", "gen", steps)
    marks.wrap_method(VLLMGeneration, "sync_weights", "update_weights", steps)


def main(argv: list[str] | None = None) -> int:
    spec = prepare(argv, "verl_recipes.peers.run_trl")
    if spec is None:
        return 2
    install(marks.Steps(gpus=spec.gpus))
    from trl.scripts import grpo

    parsed = grpo.make_parser().parse_args_and_config(spec.argv)
    grpo.main(*parsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
