"""The memory planner: `verl-recipes plan`.

`model` turns a config.json into parameter, activation and KV-cache numbers; `inputs` reads the
memory-relevant settings of a composed verl 0.9.1 config; `phases` predicts every phase of a
PPO/GRPO step per GPU; `knobs` finds what to change when it does not fit; `cost` prices a step;
`runs` reads the committed measured runs and `errors` compares the predictions with them; `host`
predicts a node's host RAM (offloaded weights, CPU copies, the run's processes) and `host_runs`
checks it against the runs. Everything but `errors`' inputs is derived from shapes and verl/vLLM's own sizing rules;
the few overheads that are not (`phases.Constants`, `host.HostConstants`) are named priors until
fitted to measured runs.
"""
