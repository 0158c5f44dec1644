"""Host RAM of one node of a verl 0.9.1 run: what the CPU side holds while the GPU trains.

An offloaded recipe moves its weights to the host, so a 24 GB card needs a machine with far more
RAM than the card. The figure is per node (node 0, which also loads the checkpoint), for four
moments of a run, as a fixed base plus terms read from verl 0.9.1's and torch's code:

  load            the trainer builds its models (critic, separate reference, actor, in the order
                  `engine_workers` builds them) before vLLM and the agent loop start
  first sync      verl's first weight sync to vLLM, before step 1 (no optimizer state yet)
  train           a step's training phases, after the first update made the optimizer state
  update_weights  the weight sync inside a step

Terms (bytes per trainer process, times the processes on the node unless said otherwise):

  * pinned weights: FSDP2's `CPUOffloadPolicy(pin_memory=True)` (`offload_policy: true`, and every
    forward-only reference: `FSDPEngine._build_fsdp_module`) pins each parameter's shard on the
    host for good; `param_offload` without it moves the parameters there between phases with
    `Tensor.to("cpu", non_blocking=True)`, which also allocates pinned memory
    (`offload_fsdp2_model_to_cpu`; FSDP1: `flat_param_to`, one flat parameter per wrapped unit).
    torch's caching host allocator rounds every pinned block up to a power of two, and keeps freed
    blocks cached, so a 86 MiB MLP matrix holds 128 MiB of RAM: Llama-2-7B's 12.55 GiB of bf16
    weights pin 16.5 GiB. An FSDP1 forward-only reference (`CPUOffload(offload_params=True)`)
    pins its local shard and a CPU gradient buffer of the same size per unit (torch's
    `FlatParamHandle.init_flat_param_attributes`), at its first forward, in step 1.
  * optimizer and gradients on the host: with the offload policy, AdamW's two moments are created
    on the CPU next to the parameters (pageable, exact size) and each reduce-scattered gradient is
    copied there (pinned); `optimizer_offload` alone moves the moments with `non_blocking` copies
    (pinned, `offload_fsdp_optimizer`). They exist from the first update on.
  * checkpoint copy (load, node 0): `from_pretrained` builds the whole model on the CPU on the
    first rank of the FSDP mesh (every rank when embeddings are tied,
    `get_init_weight_context_manager`), in `model_dtype`, until FSDP has taken the weights.
  * load transient: with a CPU offload policy, `fsdp2_load_full_state_dict` calls torch's
    `set_model_state_dict(cpu_offload=True)`, whose `_broadcast_state_dict` keeps a pageable
    `.cpu()` copy of every local shard until the load ends: one more copy of the weights.
  * verl's merged LoRA sync: `merged_lora_context(..., backup_adapters=True)` clones every base
    weight to the CPU (`backup_base_model_weights`) for the whole sync. The recipes' default
    streams `W + scaling * B @ A` out of place instead and takes no CPU copy
    (`verl_recipes.fixes.MERGE_FIX`, FSDP2 only);
    `--verl-fix-off lora-merge-out-of-place` restores verl's path.
  * verl's adapter sync under FSDP1 with `rollout.layered_summon`: verl's layered summon finds no
    LoRA tensor and `collect_lora_params` gathers the whole model into host memory on every rank
    instead (`adapter_full_gather`), at each sync; under FSDP1's default `use_orig_params: false`
    the copy outlives the sync until the actor's next forward (`gather_outlives_sync`), so the
    next generation and a validation hold it too. The recipes' default gathers the adapter alone
    (`verl_recipes.fixes.LAYERED_SUMMON_FIX`); `--verl-fix-off lora-layered-summon-fsdp1`
    restores verl's path.
  * vLLM at sleep level 1 (a LoRA served as an adapter, `model.lora.merge: false`:
    `vLLMHttpServer._resolve_sleep_level`) offloads its weights to pinned host memory
    (`CuMemAllocator.sleep(offload_tags=("weights",))`) while the trainer works; level 2 (full or
    merged weights, the recipes' case) discards them; `free_cache_engine: false` never sleeps.
  * processes: a base fitted to the committed runs of the same configuration of Ray and vLLM
    (`HostConstants`, `host_fit`), plus the processes those runs did not have: agent-loop workers
    beyond their count, and a trainer process and a vLLM worker for every GPU of the node beyond
    the first (priors from measured per-process RSS).

RSS counts each process's shared library pages again; PSS divides them among the processes that
share them, so PSS is what the node really spends and the figure to compare with its RAM. Every
term is private memory (PSS = RSS), so the two figures differ by the base alone. Megatron's offload
keeps each model's bf16 weights at exact size and each fp32 master and moment in its own pinned
block (checked against the one-GPU 70B runs at 1-3 layers). Everything here is a prediction;
`verl-recipes plan --errors` compares it with the committed runs (validation/planner-errors.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

from verl_recipes import GIB, RecipeError
from verl_recipes.fixes import (  # the merge takes no CPU copy
    LAYERED_SUMMON_FIX,
    MEGATRON_OPT_PIN_FIX,
    MEGATRON_PIN_FIX,
    MERGE_FIX,
    RAY_START_FIX,
)
from verl_recipes.layout import RankSpec, pool_share
from verl_recipes.predict.inputs import Role, Setup
from verl_recipes.predict.model import Arch


@dataclass(frozen=True)
class HostConstants:
    """The base of every moment: the run's processes before they hold any model state.

    Each fit (`host_fits.yaml`) is fitted to the committed 7b-lora runs of one configuration of those
    processes (`fitted_from`; H200 hosts, verl 0.9.1, vLLM 0.24, Ray 2.60, one GPU, two agent-loop
    workers): the measured host memory minus the module's terms, per moment
    (`verl_recipes.plan.host_fits`). Two settings change the processes: the fix `ray-local-start` (Ray's cluster starts
    without its dashboard, whose head modules are ten processes, and verl's actors take the
    prestarted workers) and vLLM's executor (`uni` runs its worker inside the engine core, `mp`
    in a third process). A measured PSS read is a lower bound (reads are 10 s to minutes apart),
    so a fit takes the largest read for PSS, the median for RSS (read at 2 Hz).

    Host cores are not a term: Ray prestarts one idle worker per CPU (each about 0.1 GiB RSS), but
    the runs do not record their host's cores; every host their campaigns describe had 16
    (gpu/hosts/*/README.md), so each fit holds a 16-core host's idle workers.
    """

    configuration: str = ""  # what the fitted runs ran, in words
    ray_local_start: bool = True  # the fix `ray-local-start` was on
    vllm_in_engine: bool = True  # vLLM's executor "uni": no worker process of its own
    # Ray's daemons and workers (TaskRunner, dataloader, reward and agent-loop workers, the vLLM
    # server, engine and worker) and the trainer process itself: in a step's phases ...
    base_train_rss: int = 0
    base_train_pss: int = 0
    # ... at the first weight sync, before the agent loop and the reward workers have all started ...
    base_first_sync_rss: int = 0
    base_first_sync_pss: int = 0
    # ... and while the trainer loads its models, before vLLM and the agent loop start.
    base_load_rss: int = 0
    base_load_pss: int = 0
    fitted_from: tuple[str, ...] = ()
    # What a configuration without committed runs adds to the closest fit, from the runs' RSS per
    # process class (`host.by_class`) mid-update in step 2, counted at RSS for both figures (an
    # upper bound of their PSS): Ray's dashboard and its head modules without `ray-local-start`
    # (ray_system 1.64-1.67 GiB in h200x1-ppo-chunked, -mb8, -start-base against 0.67-0.68 in
    # h200x1-ppo-4, -5, -start), and vLLM's worker process under `mp` (vllm_engine 4.0-4.1 GiB in
    # those first three and in 13b-fsdp's h200x1-ppo, against 3.0-3.1 under `uni`).
    ray_dashboard_bytes: int = round(1.0 * GIB)
    vllm_worker_process_bytes: int = round(1.0 * GIB)
    # An agent-loop worker beyond the fits' two, from 70b-3d's runs with eight (11.35-11.41 GiB RSS
    # mid-update, against 2.28 for the two of the 7b-lora runs: 1.52 GiB for each of the six more;
    # h200x1-ppo's were 1.05-1.23). Priors, not fitted (every committed run has one GPU), from
    # the measured RSS of such processes in h200x1-ppo and verl-vs-deepspeed's run: a trainer
    # process (2.4-2.8 GiB) and a vLLM worker (1.9 GiB) for each GPU beyond the first. Counted at
    # their RSS for both figures (an upper bound of their PSS).
    agent_worker_bytes: int = round(1.5 * GIB)
    # A reward-loop worker and a TransferQueue storage unit beside the fits' eight of each (verl's
    # defaults), from the peak host read of 70b-3d's rank 16 at full depth, which ran eight of each:
    # 7.16 and 5.55 GiB of RSS (`host.by_class` per process, h200x1-ppo-rank16of32-partial), and
    # the 0.69 GiB a storage unit held in the fitted runs. Counted at RSS for both figures.
    reward_worker_bytes: int = round(0.9 * GIB)
    storage_unit_bytes: int = round(0.7 * GIB)
    # Of a pool worker's RSS, the pages it shares with the job's other processes (torch's and Ray's
    # libraries), which PSS divides among them: 70b-3d's rank 4 of 8 (TP2 x PP2, 4 layers) held
    # 21.04 GiB of RSS beyond its PSS with the job's whole pools (eight agent-loop, reward and
    # storage workers) and 12.57 with one of each (h200x1-ppo-l4-rank4of8-tp2pp2 and its rerun
    # -2, both read at their RSS peak): 8.47 GiB over the 21 workers fewer.
    pool_worker_shared_bytes: int = round(0.4 * GIB)
    # torch inductor's compile workers (`compiles_entropy`): 17 processes on a 16-core host (a pool
    # of `--workers=16` and its parent, forked from the trainer), 6.28 GiB RSS mid-update in
    # 7b-lora's two packed runs and 6.46-6.80 in 70b-3d's four; the median. They are forked, so
    # their pages are the trainer's: PSS barely moves (the packed runs' PSS matched the fit
    # without them), and the term is counted at RSS only (`forked_peak_rss` says when it is held).
    inductor_workers_rss: int = round(6.6 * GIB)
    # A dataloader worker (`data.dataloader_num_workers`) beyond the fits' two, and each of the
    # validation dataloader's while a validation runs: forked from the TaskRunner after it read the
    # dataset, so its pages are the TaskRunner's and PSS barely moves; counted at RSS only. Each
    # held 0.83-0.86 GiB of RSS in the GSM8K quickstart's runs (eight for training, sixteen during
    # its final validation: validation/verl-examples/results/gsm8k-quickstart/h100x1-ppo and
    # -rank0of1) and 0.74-0.76 in 7b-lora's (two, no validation: h200x1-ppo-5, h200x1-grpo-8x8-2).
    dataloader_worker_rss: int = round(0.84 * GIB)
    fitted_dataloader_workers: int = 2
    extra_trainer_bytes: int = round(2.8 * GIB)
    extra_vllm_worker_bytes: int = round(1.9 * GIB)
    fitted_agent_workers: int = 2
    fitted_reward_workers: int = 8
    fitted_storage_units: int = 8


#: the fits of the base: each fitted to the committed runs it lists, regenerated from them by
#: `verl-recipes plan --errors --write ...` (`verl_recipes.plan.host_fits` says how), never by hand
FITS_FILE = Path(__file__).resolve().parent / "host_fits.yaml"
FITS_SCHEMA = "verl-recipes/host-fits/1"
#: the moments a fit's base is fitted at, as the data file names them -> HostConstants' field stem
FIT_MOMENTS = {"load": "base_load", "first sync": "base_first_sync", "train": "base_train"}


def fit_from_doc(doc: dict[str, Any]) -> HostConstants:
    """One fit of the data file (`fits[]`: its configuration, runs and base in GiB) as constants."""
    base = doc["base_gib"]
    fields = {f"{stem}_{k}": round(float(base[m][k]) * GIB) for m, stem in FIT_MOMENTS.items() for k in ("rss", "pss")}
    return HostConstants(
        configuration=str(doc["configuration"]),
        ray_local_start=bool(doc["ray_local_start"]),
        vllm_in_engine=bool(doc["vllm_in_engine"]),
        fitted_from=tuple(str(r) for r in doc["runs"]),
        **fields,
    )


def load_fits(path: Path = FITS_FILE) -> dict[str, HostConstants]:
    """Fit name -> its constants, from the data file."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("schema") != FITS_SCHEMA:
        raise RecipeError(f"{path}: not a {FITS_SCHEMA} file")
    return {str(f["name"]): fit_from_doc(f) for f in doc["fits"]}


#: the fits of today's configurations, the default first; and the first runs' own
TODAY = ("default", "ray-job-env")
FIRST_RUNS = "first-runs"

FITTED = load_fits()
#: Today's default: `ray-local-start` on, vLLM's `uni` executor (recipes/7b-lora/config.yaml).
DEFAULT_FIT = FITTED["default"]
#: `--verl-fix-off ray-local-start` with vLLM's `mp` executor: the job's runtime_env, as verl
#: hands it to Ray, and verl's own executor (and every run recorded before the fix existed).
RAY_JOB_ENV_FIT = FITTED["ray-job-env"]
#: The first runs, recorded before provenance had `verl_fixes_off` (the fit's note says how they
#: differ); no configuration of today runs like them.
FIRST_RUNS_FIT = FITTED[FIRST_RUNS]


def host_fit(ray_local_start: bool, vllm_in_engine: bool, fits: Mapping[str, HostConstants] = FITTED) -> HostConstants:
    """The fit for a configuration of today's code: the one fitted to it, else today's default plus
    what the configuration runs beyond it (Ray's dashboard, vLLM's worker process). A configuration
    that runs fewer processes than the default has no runs to fit and is given the default's base:
    an upper bound. `fits`: the data file's (`load_fits`)."""
    for fit in (fits[name] for name in TODAY):
        if (fit.ray_local_start, fit.vllm_in_engine) == (ray_local_start, vllm_in_engine):
            return fit
    c = fits[TODAY[0]]
    more = 0 if ray_local_start else c.ray_dashboard_bytes
    engine = 0 if vllm_in_engine else c.vllm_worker_process_bytes  # vLLM starts after the load
    what = ("ray-local-start" if ray_local_start else "no ray-local-start") + (
        ", vLLM executor uni" if vllm_in_engine else ", vLLM executor mp"
    )
    return replace(
        c,
        configuration=f"{what} (no runs: {c.configuration} plus its processes)",
        ray_local_start=ray_local_start,
        vllm_in_engine=vllm_in_engine,
        base_train_rss=c.base_train_rss + more + engine,
        base_train_pss=c.base_train_pss + more + engine,
        base_first_sync_rss=c.base_first_sync_rss + more + engine,
        base_first_sync_pss=c.base_first_sync_pss + more + engine,
        base_load_rss=c.base_load_rss + more,
        base_load_pss=c.base_load_pss + more,
    )


@dataclass(frozen=True)
class HostTerm:
    name: str
    bytes: int


@dataclass
class HostMoment:
    name: str
    base_rss: int
    base_pss: int
    terms: list[HostTerm]

    @property
    def state(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def rss(self) -> int:
        return self.base_rss + self.state

    @property
    def pss(self) -> int:
        return self.base_pss + self.state

    def dominant(self, k: int = 3) -> list[HostTerm]:
        return sorted((t for t in self.terms if t.bytes), key=lambda t: -t.bytes)[:k]


@dataclass
class HostPlan:
    """The predicted host RAM of one node at each moment: load, first sync, train, update_weights."""

    moments: list[HostMoment]
    cpu_backup_sync: bool  # verl's merged sync with its CPU copy of the base weights
    backup_bytes: int  # that copy's size on the node (0: the config has no merged LoRA sync)
    sleep_level: int  # vLLM's sleep level between generations (0: it never sleeps)
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> HostMoment:
        """The moment of the PSS peak: the figure to hold against the node's RAM."""
        return max(self.moments, key=lambda m: m.pss)

    @property
    def rss_peak(self) -> HostMoment:
        """The moment of the RSS peak (the monitor's 2 Hz figure; it counts shared pages again)."""
        return max(self.moments, key=lambda m: m.rss)

    def moment(self, name: str) -> HostMoment:
        return next(m for m in self.moments if m.name == name)


# ---- tensors ---------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    """torch's caching host allocator: a pinned block is rounded up to the next power of two."""
    return 1 << (n - 1).bit_length() if n > 1 else n


def _shard(shape: tuple[int, int], n: int) -> int:
    """Elements of one rank's FSDP2 shard: dim 0 split into n chunks, padded."""
    rows, rest = shape
    return -(-rows // n) * rest


def base_tensors(a: Arch, critic: bool = False) -> list[tuple[int, int]]:
    """(dim 0, elements per row) of every stored tensor of the Hugging Face model (or verl's
    value model: the LM body plus a Linear(h, 1) score head with a bias)."""
    h, f, q, kv = a.hidden, a.intermediate, a.q_dim, a.kv_dim
    layer = [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f), *[(w, 1) for w in a.norm_widths()]]
    if a.qkv_bias:
        layer += [(q, 1), (kv, 1), (kv, 1)]
    if a.o_bias:
        layer += [(h, 1)]
    if a.mlp_bias:
        layer += [(f, 1), (f, 1), (h, 1)]
    out = layer * a.layers + [(a.vocab, h), (h, 1)]
    if critic:
        out += [(1, h), (1, 1)]
    elif not a.tie_embeddings:
        out += [(a.vocab, h)]
    return out


def lora_tensors(a: Arch, role: Role) -> list[tuple[int, int]]:
    """peft's A (r x in) and B (out x r) of every targeted projection."""
    if role.lora_rank <= 0:
        return []
    per = []
    for m in role.lora_targets:
        din, dout = a.linear_shape(m)
        per += [(role.lora_rank, din), (dout, role.lora_rank)]
    return per * a.layers


def _trainable(a: Arch, role: Role, critic: bool) -> list[tuple[int, int]]:
    if role.lora_rank:
        return lora_tensors(a, role) + ([(1, a.hidden), (1, 1)] if critic else [])
    return base_tensors(a, critic)


def _units(a: Arch, role: Role, critic: bool) -> list[int]:
    """FSDP1 flat parameters (elements): one per decoder layer with its adapters, and the root."""
    every = base_tensors(a, critic) + lora_tensors(a, role)
    total = sum(r * c for r, c in every)
    layer = a.layer_params() + a.lora_layer_params(role.lora_rank, role.lora_targets)
    return [layer] * a.layers + [total - layer * a.layers]


def _pinned(shapes: list[tuple[int, int]], nbytes: int, n: int) -> int:
    return sum(_pow2(_shard(sh, n) * nbytes) for sh in shapes)


def _exact(shapes: list[tuple[int, int]], nbytes: int, n: int) -> int:
    return sum(_shard(sh, n) * nbytes for sh in shapes)


def _fused_layer(a: Arch, tp: int) -> list[tuple[int, int]]:
    """One decoder layer on one TP rank as vLLM and megatron-core hold it: qkv and gate_up fused and
    split on dim 0 (column-parallel), o and down split on their input (row-parallel), the norms whole."""
    h, f, q, kv = a.hidden, a.intermediate, a.q_dim, a.kv_dim
    norms = [(w, 1) for w in a.norm_widths()]
    return [(-(-(q + 2 * kv) // tp), h), (h, -(-q // tp)), (-(-2 * f // tp), h), (h, -(-f // tp)), *norms]


def _megatron_stage_tensors(a: Arch, critic: bool, tp: int, pp: int, stage: int = 0) -> list[tuple[int, int]]:
    """megatron-core's weights on one rank of pipeline stage `stage`: its layers, and the embedding
    (first stage), the final norm and the output layer (last stage: the vocabulary's projection,
    a copy of the embedding where they are tied, or the critic's one-output head), all of them
    where PP is 1."""
    h, layer = a.hidden, _fused_layer(a, tp)
    embed = (-(-a.vocab // tp), h)
    head = [(1, h)] if critic else [embed]
    first = [embed] if stage == 0 else []
    last = [(h, 1), *head] if stage == pp - 1 else []
    return layer * -(-a.layers // pp) + first + last


def _megatron_buffer(a: Arch, role: Role, critic: bool, stage: int, exact_pin: bool) -> int:
    """Bytes of the pinned copy of a Megatron model's parameter buffer on one rank of `stage`.
    verl offloads megatron-core's DDP buffer (every trainable bf16 weight of the rank in one
    tensor) into `torch.empty(..., pin_memory=True)` once (`offload_megatron_model_to_cpu`), so the
    whole buffer is one block of the caching host allocator, rounded up to a power of two: 70b-3d's
    actor on either stage, 8.62 B parameters (16.06 GiB), takes 32 GiB; its critic takes 32 on
    stage 0 (the embedding) and 16 on stage 1 (15.94 GiB: no vocabulary projection). The fix
    `megatron-weights-exact-pinned` (`verl_recipes.worker.pinned_offload`) holds the exact size."""
    elems = sum(r * c for r, c in _megatron_stage_tensors(a, critic, role.tp, role.pp, stage))
    nbytes = elems * role.param_bytes
    return nbytes if exact_pin else _pow2(nbytes)


def _vllm_tensors(a: Arch, tp: int) -> list[tuple[int, int]]:
    """vLLM's fused weights on one TP rank (_fused_layer), with its embedding and LM head."""
    h, layer = a.hidden, _fused_layer(a, tp)
    head = [] if a.tie_embeddings else [(-(-a.vocab // tp), h)]
    return layer * a.layers + [(-(-a.vocab // tp), h), (h, 1), *head]


# ---- roles -----------------------------------------------------------------------------------
def _stage(s: Setup, role: Role) -> int:
    """The pipeline stage planned: the Setup's (`plan_host` sets one for every plan)."""
    return min(s.pp_stage or 0, role.pp - 1)


def _forward_only(role: Role) -> bool:
    return role.name == "ref"


def _cpu_policy(role: Role) -> bool:
    """FSDP2 with CPUOffloadPolicy: asked for, or forced on a forward-only reference."""
    return role.backend == "fsdp" and role.fsdp2 and (role.offload_policy or _forward_only(role))


def _resident(s: Setup, role: Role, critic: bool, exact_pin: bool = True) -> list[HostTerm]:
    """Weights a role keeps on the host from the end of its build on. `exact_pin`: the fix
    `megatron-weights-exact-pinned` is on (a Megatron buffer at its own size)."""
    a, n, pb, who = s.arch, s.world, role.param_bytes, role.name
    shapes = base_tensors(a, critic) + lora_tensors(a, role)
    if role.backend == "megatron":
        if not role.param_offload:
            return []
        if role.lora_rank:  # frozen weights move one by one, not through the DDP buffer
            stored = sum(r * c for r, c in shapes) * pb // (role.tp * role.pp)
            return [HostTerm(f"{who} weights offloaded (Megatron, exact size)", stored)]
        block = _megatron_buffer(a, role, critic, _stage(s, role), exact_pin)
        how = "exact size" if exact_pin else "rounded up to a power of two"
        return [HostTerm(f"{who} weights offloaded (Megatron, one pinned buffer, {how})", block)]
    if _cpu_policy(role) or (role.fsdp2 and role.param_offload):
        why = "offload policy" if _cpu_policy(role) else "param_offload"
        return [HostTerm(f"{who} weights, pinned ({why})", _pinned(shapes, pb, n))]
    if _forward_only(role):  # FSDP1 reference: CPUOffload pins the shard and a gradient buffer
        blocks = sum(_pow2(-(-u // n) * pb) for u in _units(a, role, critic))
        return [HostTerm(f"{who} weights and grad buffer, pinned (FSDP1 CPUOffload)", 2 * blocks)]
    if role.param_offload:  # FSDP1: one flat parameter per unit
        blocks = sum(_pow2(-(-u // n) * pb) for u in _units(a, role, critic))
        return [HostTerm(f"{who} weights, pinned (FSDP1 param_offload)", blocks)]
    return []


def _pins_at_first_forward(role: Role) -> bool:
    """Whether a role's host weights are made at its first forward rather than in its build: an
    FSDP1 forward-only reference (`CPUOffload(offload_params=True)`) pins its shard and makes its
    pinned gradient buffer in `FlatParamHandle.init_flat_param_attributes`, which FSDP1's lazy
    init calls at the module's first forward (torch 2.11 `_runtime_utils._lazy_init`), in step 1's
    reference log-probs, after loading and the first weight sync (measured: `_unpinned_shard`)."""
    return role.backend == "fsdp" and not role.fsdp2 and _forward_only(role)


def _unpinned_shard(s: Setup, role: Role, critic: bool) -> list[HostTerm]:
    """An FSDP1 reference's shard as its build leaves it: each unit's flat parameter in pageable
    host memory (FSDP1 moves it back to the CPU after sharding it on the GPU), held until the
    unit's first forward pins a copy and, at the unit's reshard, takes that copy as its data
    (`_use_sharded_flat_param`): through that forward the shard is on the host twice. Measured
    with torch 2.11 on an H100 (gpu/probes/fsdp1_ref_pin.py, rank 0 of 8 at Qwen2-7B widths, fp32:
    gpu/hosts/2026-12-07-h100x1-probe-fsdp1-ref/): the build left 3.56 GiB (the shard, 3.55), the
    first forward peaked 12.61 GiB above the start (the shard and the 9.00 GiB of pinned blocks)
    and left 9.21; the Qwen2-7B GRPO rank 0 of 8's training worker fell by 3.52 GiB as that
    forward ended."""
    shapes = base_tensors(s.arch, critic) + lora_tensors(s.arch, role)
    return [
        HostTerm(
            f"{role.name} shard, pageable (FSDP1, until its first forward's reshard)",
            _exact(shapes, role.param_bytes, s.world),
        )
    ]


def _optimizer(s: Setup, role: Role, critic: bool, exact_pin: bool = True) -> list[HostTerm]:
    """Optimizer moments and gradients on the host once the first update has made them.
    `exact_pin`: the fix `megatron-optimizer-exact-pinned` is on (each Megatron state at its size)."""
    if _forward_only(role):
        return []
    a, n, pb, who = s.arch, s.world, role.param_bytes, role.name
    train = _trainable(a, role, critic)
    if role.backend == "megatron":
        if not role.optimizer_offload:
            return []
        dp = max(1, s.world // (role.tp * role.pp * role.cp))
        if role.lora_rank:
            elems = sum(r * c for r, c in train) // (role.tp * role.pp)
            return [HostTerm(f"{who} optimizer offloaded (Megatron, fp32 master + moments)", elems * 12 // dp)]
        # verl moves each fp32 master and Adam moment with `.to("cpu", non_blocking=True)`: one
        # pinned block per tensor and state, rounded up to a power of two (measured on torch 2.11:
        # gpu/probes/pinned_rounding.py, gpu/megatron-notes.md section 11); the fix keeps each at
        # its size (`pinned_offload.make_optimizer_offload`)
        tensors = _megatron_stage_tensors(a, critic, role.tp, role.pp, _stage(s, role))
        sizes = [-(-r * c // dp) * 4 for r, c in tensors]
        blocks = sum(sizes) if exact_pin else sum(_pow2(n) for n in sizes)
        how = "exact size" if exact_pin else "power-of-two blocks"
        return [HostTerm(f"{who} optimizer offloaded (Megatron, fp32 master + moments, pinned, {how})", 3 * blocks)]
    if _cpu_policy(role):
        return [
            HostTerm(f"{who} Adam moments (CPU)", 2 * _exact(train, pb, n)),
            HostTerm(f"{who} gradients, pinned (CPU)", _pinned(train, pb, n)),
        ]
    if role.optimizer_offload:
        return [HostTerm(f"{who} Adam moments, pinned (optimizer_offload)", 2 * _pinned(train, pb, n))]
    return []


def cpu_loading_ranks(s: Setup, ranks_here: int | None = None) -> int:
    """How many of the host's trainer ranks build a whole model on the CPU with `from_pretrained`.

    verl's FSDP engine builds it on the CPU on the first rank of its FSDP mesh and on the meta
    device elsewhere, or on every rank when embeddings are tied
    (`get_init_weight_context_manager`); its mesh spans every rank (verl's `fsdp_size: -1`), so
    rank 0 alone loads, and node 0 holds one copy. A rank rehearsal's host runs `ranks_here`
    ranks: one copy each when tied, else one for rank 0 and none for any other rank (it receives
    its shards from rank 0's broadcast).
    """
    if s.arch.tie_embeddings:
        return ranks_here or s.gpus_per_node
    if ranks_here and s.rank is not None:
        return int(s.rank.rank == 0)
    return 1


def _checkpoint_copy(s: Setup, role: Role, critic: bool, loaders: int = 1) -> int:
    """`from_pretrained` on the CPU: the whole model, once per loading rank of the host
    (`cpu_loading_ranks`)."""
    if role.backend == "megatron":
        return 0
    return loaders * _exact(base_tensors(s.arch, critic), role.param_bytes, 1)


def _upcast_pages(s: Setup, role: Role, critic: bool, loaders: int = 1) -> int:
    """The checkpoint's own pages while `from_pretrained` upcasts it (`model_dtype: fp32` from a
    bf16 checkpoint): the fp32 copy is new memory, and the safetensors files it is read from stay
    mapped, in RSS, until `from_pretrained` returns (`plan_host` counts them in that moment only).
    In bf16 the copy is the mapped pages themselves (13b-fsdp: the trainer held its 24.24 GiB copy
    and nothing more). verl-vs-deepspeed's rank rehearsal (fp32) held 42.88 GiB in its trainer at
    the load peak: the 28.37 GiB copy, about 2.3 GiB of process, and 12.2 of its 14.2 GiB
    checkpoint. Every committed checkpoint is stored in bf16."""
    if role.backend == "megatron" or role.param_bytes <= 2:
        return 0
    return loaders * _exact(base_tensors(s.arch, critic), 2, 1)


def cpu_backup_sync(s: Setup, fixes_off: Iterable[str] = ()) -> bool:
    """Whether the weight sync is verl's merged one with its CPU copy of every base weight."""
    a = s.actor
    if not (a.lora_rank and s.lora_merge and a.backend == "fsdp"):
        return False
    return MERGE_FIX in set(fixes_off) or not a.fsdp2  # the fix covers FSDP2 only


def compiles_entropy(s: Setup) -> bool:
    """Whether the trainer runs torch.compile, which starts inductor's compile workers at the first
    log-prob pass (step 1) and keeps them until 60 s after its last compile (`forked_peak_rss`;
    the short runs the term was read from ended inside that minute). verl 0.9.1's Megatron engine always compiles
    a piece of its vocab-parallel entropy (`_VocabParallelEntropy.forward`'s `mul_reduce`); the
    FSDP engine compiles `entropy_from_logits` when `use_torch_compile` (the default) and calls it
    on the padding-free path only (`use_remove_padding`), the padded path calling it uncompiled.
    Every committed run bears this out: the four 70b-3d runs that stepped and 7b-lora's two
    packed runs have the workers, no other run has them. `TORCHINDUCTOR_COMPILE_THREADS=1` would
    compile in the trainer itself; no recipe sets it."""
    if s.actor.backend == "megatron":
        return True
    return s.remove_padding and s.torch_compile


def forked_peak_rss(s: Setup, c: HostConstants) -> int:
    """The RSS of the worker processes that come and go within the steps, at their largest: torch
    inductor's compile pool (`compiles_entropy`), from the first compile in step 1 until 60 s
    after the last (`torch._inductor.config.quiesce_async_compile_time`: the pool's workers exit,
    its parent stays), or the validation dataloader's workers (`data.dataloader_num_workers`, a
    `StatefulDataLoader` iterated by each validation, beside the train dataloader's). verl
    validates every `test_freq` steps and at the last; the pool, compiling in step 1, has gone by
    then unless the steps are short: the GSM8K quickstart's pool left 60 s after its last compile,
    in step 2, and its final validation ran its sixteen dataloader workers without it
    (validation/verl-examples/results/gsm8k-quickstart/h100x1-ppo). The larger of the two, not
    their sum."""
    inductor = c.inductor_workers_rss if compiles_entropy(s) else 0
    validation = s.dataloader_workers * c.dataloader_worker_rss if s.validates else 0
    return max(inductor, validation)


def adapter_base_sync(s: Setup) -> bool:
    """Whether verl's first weight sync copies the whole base model to the CPU: a LoRA served as an
    adapter (`lora.merge: false`) to a vLLM started with dummy weights sends the base once,
    `collect_lora_params(base_sync_done=False)` moving the model to the CPU and taking a `.cpu()`
    copy of every full weight (FSDP engine)."""
    a = s.actor
    return bool(a.lora_rank and not s.lora_merge and a.backend == "fsdp" and "dummy" in s.rollout.load_format)


def layered_fsdp1(s: Setup) -> bool:
    """Whether the actor's adapter syncs go through verl's layered summon under FSDP1: a LoRA
    served as an adapter (not merged) on FSDP1 with `rollout.layered_summon`, the code fix 12
    (`LAYERED_SUMMON_FIX`) replaces."""
    a = s.actor
    return bool(a.lora_rank and not s.lora_merge and a.backend == "fsdp" and not a.fsdp2 and s.rollout.layered_summon)


def adapter_full_gather(s: Setup, fixes_off: Iterable[str] = ()) -> bool:
    """Whether each adapter sync gathers the whole model into each rank's host memory: verl
    0.9.1's layered summon under FSDP1 (`layered_fsdp1`) without fix 12. verl's LoRA wrap policy
    makes every lora_A / lora_B leaf an FSDP unit of its own, whose own parameter is named
    `weight`, so `layered_summon_lora_params` skips those units (no "lora_" in the names) and the
    decoder layers' units leave them out as nested; it returns nothing, and `collect_lora_params`
    falls back to `FSDP.summon_full_params(module, offload_to_cpu=True)`: every full weight copied
    to the CPU (Qwen2.5-3B's rank of 2 on an H100: its training worker +12.1 GiB in the first
    sync, the 11.5 GiB of its fp32 weights). FSDP2 gathers each unit's LoRA tensors alone, and so
    does FSDP1 with the fix (`verl_recipes.worker.layered_summon`): the adapter alone reaches the host."""
    return layered_fsdp1(s) and LAYERED_SUMMON_FIX in set(fixes_off)


def gather_outlives_sync(s: Setup, fixes_off: Iterable[str] = ()) -> bool:
    """Whether the whole-model copy of an adapter sync (`adapter_full_gather`) stays in host memory
    after the sync, until the actor's next forward. In FSDP1's `_unshard_fsdp_state_params`
    (torch 2.11) the summon's `ExitStack` closes `_unflatten_as_params` before `handle.to_cpu()`:
    with `use_orig_params: false` (verl's default) the former leaves each module's parameters as
    plain `Tensor` views of the flat parameter, which is then still the CPU copy; `to_cpu` copies
    it back to the GPU without remaking the views (`_use_unsharded_flat_param` remakes them only
    in a forward), and the reshard leaves them be. The views keep the copy alive until the next
    forward's unshard points them at the GPU: the next step's generation, and a validation after
    the last sync, hold it. Qwen2.5-3B's rank 0 of 2 on an H100 (2026-12-07) read it three times:
    the training worker +12.1 GiB from each sync to the first 1.3 s of the next old_log_prob,
    through gen 1, gen 2 and the final validation."""
    return adapter_full_gather(s, fixes_off) and not s.actor.orig_params


def sleep_level(s: Setup) -> int:
    """vLLM's sleep between generations (`vLLMHttpServer._resolve_sleep_level`, hybrid mode)."""
    if not s.rollout.free_cache_engine:
        return 0
    return 1 if s.actor.lora_rank and not s.lora_merge else 2


def _pools(s: Setup, ranks_here: int | None, pools_shared: bool) -> tuple[int, int, int]:
    """The node's agent-loop workers, reward workers and storage units: the job's, or a rank
    rehearsal's share of them where it ran only its share (`pools_shared`)."""
    agents, rewards, units = s.agent_workers, s.reward_workers, s.storage_units
    if ranks_here and pools_shared:
        return (
            pool_share(agents, s.world, ranks_here),
            pool_share(rewards, s.world, ranks_here),
            pool_share(units, s.world, ranks_here),
        )
    return agents, rewards, units


def _load_terms(
    s: Setup, roles: list[tuple[Role, bool]], resident: dict[str, list[HostTerm]], per_node: int, loaders: int
) -> list[HostTerm]:
    """load: the roles one after another; each holds its checkpoint copy while it builds. The
    checkpoint's pages are mapped while `from_pretrained` reads them, and unmapped when it
    returns, before a CPU-offloaded role pins its shard and copies the state into it: two
    moments, not one sum (verl-vs-deepspeed's rank 0 of 4 with its reference offloaded: the
    trainer at 42.2 GiB reading, then 50.2 = copy 28.4 + pinned 13.5 + load copy 7.1 + 1.8 of
    process, where the four at once would be 65). The heaviest of them."""
    loads: list[list[HostTerm]] = []
    done: list[HostTerm] = []
    for role, crit in roles:
        copy = HostTerm(f"{role.name} checkpoint copy (from_pretrained)", _checkpoint_copy(s, role, crit, loaders))
        pages = HostTerm(f"{role.name} checkpoint pages (read while upcast)", _upcast_pages(s, role, crit, loaders))
        loads.append([*done, copy, pages])
        if _cpu_policy(role):
            shapes = base_tensors(s.arch, crit) + lora_tensors(s.arch, role)
            state = HostTerm(
                f"{role.name} load copy (set_model_state_dict)", per_node * _exact(shapes, role.param_bytes, s.world)
            )
            loads.append([*done, copy, *resident[role.name], state])
        done += resident[role.name]
    return max(loads, key=lambda t: sum(x.bytes for x in t))


@dataclass(frozen=True)
class _Sync:
    """What the weight sync holds on the host: vLLM's pinned weights at sleep level 1, verl's CPU
    copy of the base weights for its merged LoRA sync, its first adapter sync's copy of the model."""

    level: int  # vLLM's sleep level
    vllm: list[HostTerm]
    fused: bool  # verl's merged sync with its CPU copy (`cpu_backup_sync`)
    size: int  # that copy's size on the node, whether it is taken or not
    backup: list[HostTerm]
    first: list[HostTerm]
    gather: list[HostTerm]  # what every adapter sync gathers to the host (`adapter_full_gather`)
    held_gather: list[HostTerm]  # the same copy, held in the steps after the sync (`gather_outlives_sync`)


def _sync_terms(s: Setup, fixes_off: tuple[str, ...], per_node: int) -> _Sync:
    a = s.arch
    level = sleep_level(s)
    vllm: list[HostTerm] = []
    if level == 1:  # freed blocks stay in torch's host cache after wake-up: held from then on
        w = _pinned(_vllm_tensors(a, s.rollout.tp), s.rollout.dtype_bytes, 1)
        vllm = [HostTerm("vLLM weights, pinned (sleep level 1)", w * per_node)]
    merged = bool(s.actor.lora_rank and s.lora_merge and s.actor.backend == "fsdp")
    size = _exact(base_tensors(a), s.actor.param_bytes, s.world) * per_node if merged else 0
    fused = cpu_backup_sync(s, fixes_off)
    backup = [HostTerm("verl's merged sync: CPU copy of the base weights", size)] if fused else []
    first = []
    if adapter_base_sync(s):
        base_copy = _exact(base_tensors(a), s.actor.param_bytes, 1) * per_node
        first = [HostTerm("verl's first adapter sync: CPU copy of the base model", base_copy)]
    gather = []
    if adapter_full_gather(s, fixes_off):
        whole = _exact(base_tensors(a) + lora_tensors(a, s.actor), s.actor.param_bytes, 1) * per_node
        gather = [HostTerm("verl's adapter sync: whole model gathered to the CPU (FSDP1 layered summon)", whole)]
    held_gather = []
    if gather_outlives_sync(s, fixes_off):
        held = "verl's adapter sync's whole-model copy, held until the actor's next forward"
        held_gather = [HostTerm(held, gather[0].bytes)]
    return _Sync(level, vllm, fused, size, backup, first, gather, held_gather)


def _bases(
    s: Setup, c: HostConstants, per_node: int, pools: tuple[int, int, int]
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(RSS, PSS) of the base at train, first sync and load: the fit's, plus the processes the
    fitted runs did not have (pool workers beyond theirs, a trainer and a vLLM worker for every GPU
    of the node beyond the first, inductor's compile workers)."""
    agents, rewards, units = pools
    # the fits' base holds their pools; a configuration with more or fewer adds or takes the difference
    extra = (
        (agents - c.fitted_agent_workers) * c.agent_worker_bytes
        + (rewards - c.fitted_reward_workers) * c.reward_worker_bytes
        + (units - c.fitted_storage_units) * c.storage_unit_bytes
    )
    more = max(0, per_node - 1)
    train_extra = extra + more * (c.extra_trainer_bytes + c.extra_vllm_worker_bytes)
    load_extra = more * c.extra_trainer_bytes
    # a pool worker's RSS counts the libraries it shares with the others again; its PSS does not
    fitted = c.fitted_agent_workers + c.fitted_reward_workers + c.fitted_storage_units
    workers = agents + rewards + units - fitted
    pss_extra = train_extra - workers * c.pool_worker_shared_bytes
    # forked workers, counted at RSS: the train dataloader's beyond the fits' for the whole run, and
    # the larger of inductor's compile pool and a validation's dataloader workers, which do not meet
    # (`forked_peak_rss`)
    loaders = (s.dataloader_workers - c.fitted_dataloader_workers) * c.dataloader_worker_rss
    forked = loaders + forked_peak_rss(s, c)
    return (
        (c.base_train_rss + train_extra + forked, c.base_train_pss + pss_extra),
        (c.base_first_sync_rss + train_extra, c.base_first_sync_pss + pss_extra),
        (c.base_load_rss + load_extra, c.base_load_pss + load_extra),
    )


def _megatron_note(s: Setup, exact_pin: bool, optim_exact: bool) -> str:
    stage = f" (pipeline stage {s.pp_stage})" if s.actor.pp > 1 else ""
    weights = "at exact size" if exact_pin else "rounded up to a power of two"
    states = "at exact size" if optim_exact else "in power-of-two blocks"
    return f"Megatron{stage}: each model's weights in one pinned buffer {weights}, its optimizer states pinned {states}"


def plan_host(
    s: Setup,
    fixes_off: Iterable[str] = (),
    c: HostConstants | None = None,
    ranks_here: int | None = None,
    pools_shared: bool = False,
) -> HostPlan:
    """Predict the host RAM of node 0 at every moment of a run.

    `c`: the fit of the base (`host_fit` of the configuration: the fix `ray-local-start` off or
    on, vLLM's executor) unless given. `ranks_here`: how many of the node's ranks the host runs,
    when not all of them: a rank rehearsal (`train --rank`) runs one rank's processes, so its host
    holds one rank's share of every per-rank term, not the node's, and the checkpoint copy only
    where that rank builds one (`cpu_loading_ranks`: rank 0, or any rank of a tied-embedding model).
    `pools_shared`: the host also runs only those ranks' share of the job's CPU worker pools
    (`layout.JOB_POOLS`: a rehearsal whose provenance says `pools: rank share`; one without
    it ran them whole)."""
    fixes_off = tuple(fixes_off)
    if s.actor.backend == "megatron" and s.actor.pp > 1 and s.pp_stage is None:
        # a node holds the ranks of one stage (megatron-core's order puts a stage's ranks together):
        # the stage whose node holds the most decides
        stages = (replace(s, pp_stage=0), replace(s, pp_stage=s.actor.pp - 1))
        plans = [plan_host(x, fixes_off, c, ranks_here, pools_shared) for x in stages]
        return max(plans, key=lambda hp: hp.peak.pss)
    c = c or host_fit(RAY_START_FIX not in fixes_off, s.rollout.executor == "uni")
    per_node = ranks_here or s.gpus_per_node
    roles = [(r, crit) for r, crit in ((s.critic, True), (s.ref_role if s.ref == "separate" else None, False)) if r]
    roles.append((s.actor, False))

    def node(terms: list[HostTerm]) -> list[HostTerm]:
        return [HostTerm(t.name, t.bytes * per_node) for t in terms]

    exact_pin = MEGATRON_PIN_FIX not in fixes_off
    resident = {r.name: node(_resident(s, r, crit, exact_pin)) for r, crit in roles}
    optim_exact = MEGATRON_OPT_PIN_FIX not in fixes_off
    optim = [t for r, crit in roles for t in node(_optimizer(s, r, crit, optim_exact))]
    held = [t for r, _ in roles for t in resident[r.name]]
    # an FSDP1 reference holds its pageable shard from its build until its first forward, which
    # pins it (`_pins_at_first_forward`): the shard then in both forms for that forward
    unpinned = {r.name: node(_unpinned_shard(s, r, crit)) for r, crit in roles if _pins_at_first_forward(r)}
    built = {r.name: unpinned.get(r.name, resident[r.name]) for r, _ in roles}
    held_built = [t for r, _ in roles for t in built[r.name]]
    first_forward = [t for terms in unpinned.values() for t in terms]
    load = _load_terms(s, roles, built, per_node, cpu_loading_ranks(s, ranks_here))
    sync = _sync_terms(s, fixes_off, per_node)
    notes = [_megatron_note(s, exact_pin, optim_exact)] if s.backend == "megatron" else []
    base_t, base_s, base_l = _bases(s, c, per_node, _pools(s, ranks_here, pools_shared))
    moments = [
        HostMoment("load", *base_l, load),
        HostMoment("first sync", *base_s, held_built + sync.vllm + sync.backup + sync.first + sync.gather),
        HostMoment("train", *base_t, held + optim + sync.vllm + first_forward + sync.held_gather),
        HostMoment("update_weights", *base_t, held + optim + sync.vllm + sync.backup + sync.gather),
    ]
    return HostPlan(moments, sync.fused, sync.size, sync.level, notes)


# ---- the host this runs on -------------------------------------------------------------------
#: the share of a host's memory the planner's host figure may take without a warning. 70b-3d's
#: rank 16 of 32 was predicted at 115.6 of a 125.8 GiB host (92%) and ran out of it in the
#: actor's update (gpu/hosts/2026-12-04-h200x1-70b-rank/): the PSS peak was read at most every
#: 10-60 s, and a worker's growth between reads is what the margin is for.
HOST_MARGIN = 0.9


def host_ram_warning(what: str, need: int, total: int | None = None) -> str | None:
    """`N GiB total; WHAT needs about M GiB (...)` when this host has less RAM than the planner's
    PSS peak for WHAT, or less than `HOST_MARGIN` more than it, else None. Callers print it after
    `WARN host-ram`.

    `total` defaults to psutil's MemTotal. A warning, never a refusal: the figure is a prediction,
    and some VMs grow MemTotal as memory is used (a balloon driver; gpu/offline-host.sh turns Ray's
    memory monitor off for that reason), so a small total at start does not prove that the run
    cannot get the memory later.
    """
    if total is None:
        total = int(psutil.virtual_memory().total)
    if total < need:
        return (
            f"{total / GIB:.1f} GiB total; {what} needs about {need / GIB:.0f} GiB "
            "(planner, PSS peak; see verl-recipes plan)"
        )
    if need > HOST_MARGIN * total:
        return (
            f"{total / GIB:.1f} GiB total; {what} needs about {need / GIB:.0f} GiB "
            f"({need / total:.0%} of it; planner, PSS peak): less than {1 - HOST_MARGIN:.0%} to spare, "
            "within the planner's error; a run this close has run out of host memory"
        )
    return None


def host_lines(s: Setup, label: str, fixes_off: Sequence[str], rank: RankSpec | None, here: bool) -> list[str]:
    """The pre-flight's host RAM for the run `label` names: on the host that trains (`here`), RAM
    below the planner's figure is one `WARN host-ram` line, never a refusal (`host_ram_warning`);
    a preview states the figure for the GPU host to have. A rank rehearsal's host runs one rank
    and its share of the job's CPU worker pools."""
    ranks_here = 1 if rank is not None else None
    need = plan_host(s, fixes_off, ranks_here=ranks_here, pools_shared=rank is not None).peak.pss
    what = label + (" (one rank's processes)" if rank is not None else "")
    if not here:
        return [f"host RAM: {what} needs about {need / GIB:.0f} GiB on the GPU host (planner, PSS peak)"]
    warn = host_ram_warning(what, need)
    return [f"WARN host-ram {warn}"] if warn else []
