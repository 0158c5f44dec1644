"""The memory model: what a verl job needs, predicted from its configuration alone.

`model` turns a config.json into parameter, activation and KV-cache numbers; `inputs` reads the
memory-relevant settings of a composed verl 0.9.1 config into a `Setup`, and `setup` makes the
`Setup` of a job named as `plan` and `train` name it; `gpus` is the GPU catalogue; `phases`
predicts every phase of a PPO/GRPO step per GPU and `host` a node's host RAM (offloaded weights,
CPU copies, the run's processes); `knobs` finds what to change when a job does not fit; `cost`
prices a step. Everything is derived from shapes and verl/vLLM's own sizing rules; the few
overheads that are not (`phases.Constants`, `host.HostConstants`) are named priors or fits.

Nothing here reads a committed run: the measured evidence (runs, calibration, error tables) lives
in `verl_recipes.plan`, above this wing, which holds the model against it.
"""
