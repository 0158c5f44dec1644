"""Ray on a Slurm allocation: check it, start Ray on every node, run the trainer, tear down.

The sbatch templates under ``recipes/*/slurm/`` are thin: they set the recipe's variables and call
``python -m verl_recipes.cluster launch`` (also ``verl-recipes ray-slurm launch``). The
launcher runs in the batch step on the first node and drives everything else as Slurm job steps,
so Slurm tracks, signals and accounts every process:

1. ``check``: the allocation and variables are checked before anything starts (no MODEL_PATH,
   GPUs not divisible by TP x PP, no container image, ports that collide); one line says what to
   change and the job exits 2.
2. ``verl-recipes verify [--recipe ID]`` runs on every node (one task per node); a failure ends
   the job before Ray starts. A probe run omits ``--recipe`` so a node without a GPU passes.
3. The Ray head starts on the first node, then one worker per other node, each as
   ``srun --overlap --nodes=1 --ntasks=1 --nodelist=<node>`` (``--overlap`` so the steps share
   the node's CPUs and GPUs with each other and with the trainer step).
4. A driver step on the head polls Ray until every expected node and GPU has registered (with a
   deadline, no fixed sleeps), then runs TRAIN_CMD there; a probe run runs a probe instead.
5. On exit, error, ``scancel`` or pre-emption the steps get SIGTERM (``ray start --block`` stops
   its own processes on SIGTERM), stragglers are cancelled by step id, and a last step on every
   node kills whatever this job's Ray left (a scoped ``ray stop``: plain ``ray stop`` would also
   kill other jobs' Ray on a shared node).

Ray token authentication stays on across nodes: a fresh token per run in a job-private file
(mode 600, folder 700, under JOB_DIR, which every node must see) reaches every process through
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``. The dashboard binds to 127.0.0.1 unless
RAY_DASHBOARD_HOST says otherwise.

A probe run (PROBE=1) needs no GPU: nodes advertise GPUS_PER_NODE logical GPUs to Ray, the
trainer is replaced by a probe (a Ray task pinned to each node with NodeAffinitySchedulingStrategy
that reports its host and node id), and RAY_NODES_PER_HOST may start several Ray nodes on one host,
each its own srun step with its own ports. Debian's Slurm cannot run several slurmd on one host,
so the CI probes multi-node this way: one Slurm node, several Ray nodes.

The parts: ``settings`` (the checked launch), ``steps`` (the srun lines), ``launcher`` (the batch
step: runs the steps, tears down, requeues), ``in_step`` (what runs inside a step: a Ray node, the
driver, the reap) and ``cli``. The package imports only the standard library at load time: in
container deployments the launcher runs on the host's python3 with ``PYTHONPATH=<checkout>/common``
while Ray runs in the container. Variables are listed in ``ENV_HELP`` (``python -m verl_recipes.cluster
env``).

Ray's own ``ray symmetric-run`` (start Ray on every node of an allocation, run one command on the
head, stop Ray) does not replace steps 3 to 5: it picks the head by the address being local, so it
cannot stack Ray nodes on one host (the probe run above); it refuses a node where another job's Ray
runs and its teardown is a plain ``ray stop``, which ends that other Ray too; SIGTERM to it (scancel,
the time limit) leaves its Ray and the command running; and its wait for ``--min-nodes`` counts nodes,
not GPUs, for a fixed 30 s.
"""
