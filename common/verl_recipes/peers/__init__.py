"""The peers: the trainers a user would pick instead of verl, on the same GPU and the same work.

One workload (`peers.workload`: 7b-lora's GRPO job, its model widths, prompts, lengths, sampling,
reward and steps) composes each side's configuration: verl's is the recipe's own (`train` with
its variants), TRL's GRPOConfig (`peers.trl`) and OpenRLHF's command line (`peers.openrlhf`),
each first as the peer's own documentation recommends for one GPU and then with the knobs we
would turn were it ours. A peer runs in its own environment (`images/peers/<name>.toml`, carried
by `verl-recipes wheelhouse --peer`), under our monitor, from a launcher that runs inside that
environment (`peers.run_trl`, `peers.run_openrlhf`) and marks the peer's phases by wrapping its
own step functions, changing nothing they do, into the run folder's phases.jsonl and
metrics.jsonl (`peers.marks`). `verl-recipes report` reads such a folder as it reads verl's, and
`peers.table` sets the three side by side.

The launchers and `peers.marks` run in the peer's environment, which has neither verl nor our
stack: they import the standard library and the package's base at load time, and the peer's
trainer inside their functions.
"""
