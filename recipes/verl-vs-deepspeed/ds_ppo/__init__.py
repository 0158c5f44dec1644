"""A small, readable PPO loop on DeepSpeed ZeRO-3: the baseline of recipe verl-vs-deepspeed.

Seed article 002 compares verl with "a hand-written PPO loop on DeepSpeed ZeRO-3 + gradient
checkpointing + bf16, actor and critic initialised separately". The article ships no code, so its
numbers cannot be re-run. This package is that baseline written down, so both sides of the
comparison run the same workload and can be re-measured:

- `workload`: the shared workload (model, prompts of a fixed token length, response length,
  batch, steps) and the Hydra overrides that give verl the same one;
- `losses`: the PPO math, delegated to verl's own `core_algos` so it is verl's, not a copy;
- `engines`: actor and critic as `deepspeed.initialize` engines (and a plain-torch engine with
  the same interface, used only by the CPU tests);
- `timing`: phase timing with torch.cuda.Event after a synchronize;
- `loop`: one PPO step (generate, score, log-probs, values, GAE, critic update, actor update);
- `harness`: the measured run (warm-up and measured steps, NVML peaks, JSON, Markdown, PNG) and
  the side-by-side report with a verl run's metrics.

The entry point is `recipes/verl-vs-deepspeed/compare.py`.
"""

from __future__ import annotations

GIB = 1024**3
