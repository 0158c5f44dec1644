"""What `verl-recipes plan` prints: a judged job as text, or as JSON a script can read.

`cli.judgement` decides (the model's plans, the evidence per GPU, the verdict, the advice, the cost,
the host RAM) and hands one `Judgement` here; nothing here plans or reads a run, so the two
outputs say the same thing by construction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from verl_recipes import GIB
from verl_recipes.fixes import MERGE_FIX
from verl_recipes.plan.advice import Advice, Calibrated, host_bytes, variant_line, verdict_line
from verl_recipes.predict.host import HostPlan
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.knobs import Suggestion
from verl_recipes.predict.margin import FITS, NO, TIGHT, Margin, margin_lines
from verl_recipes.predict.phases import Constants, GPUPlan


@dataclass(frozen=True)
class Judgement:
    """One job judged on some GPUs: everything either output shows."""

    label: str  # the job as the user named it
    setup: Setup
    plans: list[GPUPlan]  # the planner's plan per GPU, in the order asked
    constants: Constants
    calibrated: dict[str, Calibrated | None]  # per GPU id: the evidence beyond the planner
    fits: dict[str, bool]  # per GPU id: the verdict (`advice.verdict`)
    advice: dict[str, Advice]  # per GPU id where the job does not fit
    host: HostPlan
    fixes_off: tuple[str, ...] = ()
    cost_lines: list[str] = field(default_factory=list)
    cost_json: list[dict[str, Any]] = field(default_factory=list)
    behind: str | None = None  # what stands behind a multi-GPU figure (`evidence.behind_line`)
    margins: dict[str, Margin] = field(default_factory=dict)  # per GPU id: the verdict's band
    headroom: dict[str, Advice] = field(default_factory=dict)  # per tight GPU id: what buys the margin


def _g(b: float) -> str:
    return f"{b / GIB:.1f}"


def describe(s: Setup) -> list[str]:
    a, r = s.arch, s.rollout
    act = s.actor
    if act.backend == "megatron":
        lay = f"Megatron TP{act.tp} x PP{act.pp} x CP{act.cp} x DP{s.dp(act)}"
    else:
        lay = f"FSDP{'2' if act.fsdp2 else ''} over {s.world} GPU(s)" + (
            f", Ulysses SP{act.ulysses_sp}" if act.ulysses_sp > 1 else ""
        )
    algo = "with critic" if s.critic else "no critic"
    lora = f"actor LoRA r{act.lora_rank}" if act.lora_rank else "full fine-tune"
    lines = [
        f"model: {a.describe()}",
        f"layout: {lay} ({s.nnodes} node(s) x {s.gpus_per_node}); {algo}; {lora}; reference: {s.ref}; "
        f"vLLM TP{r.tp}, gpu_memory_utilization {r.gpu_memory_utilization:g}, "
        f"free_cache_engine {str(r.free_cache_engine).lower()}",
        f"batch: {s.train_batch_size} prompts x n={r.n}, {s.prompt_len}+{s.response_len} tokens each "
        "(upper bound: every sequence at full length)",
    ]
    lines += [f"note: {n}" for n in s.notes]
    return lines


def _constants_line(c: Constants) -> str:
    src = f"fitted from {', '.join(c.fitted_from)}" if c.fitted_from else "priors, not yet fitted to measured runs"
    return (
        f"constants ({src}): CUDA context {c.cuda_context_bytes / GIB:.2f} GiB/process, vLLM CUDA graphs "
        f"{c.vllm_graph_bytes / GIB:.2f} GiB, NCCL {c.nccl_bytes_per_communicator / GIB:.3f} GiB/communicator "
        "(vLLM, Megatron)"
    )


# ---- text -------------------------------------------------------------------------------------
def _peak_table(j: Judgement) -> list[str]:
    """Per-GPU peaks phase by phase, the KV cache and the verdict, one column per GPU."""
    plans = j.plans
    names = [p.gpu.id for p in plans]
    w = max(10, *(len(n) for n in names))
    out = [f"{'per-GPU peak, GiB':18s}" + "".join(f"{n:>{w + 2}s}" for n in names)]
    out.append(f"{'  visible':18s}" + "".join(f"{_g(p.gpu.visible_bytes):>{w + 2}s}" for p in plans))
    for ph in plans[0].phases:
        row = f"  {ph.phase:16s}"
        for p in plans:
            tot = next(x.total for x in p.phases if x.phase == ph.phase)
            mark = "" if tot <= p.gpu.visible_bytes else "!"
            row += f"{_g(tot) + mark:>{w + 2}s}"
        out.append(row)
    out.append(f"{'  vLLM KV tokens':18s}" + "".join(f"{p.kv_tokens:>{w + 2}d}" for p in plans))
    out.append(f"{'  verdict':18s}" + "".join(f"{_word(j, p):>{w + 2}s}" for p in plans))
    return out


def _word(j: Judgement, p: GPUPlan) -> str:
    m = j.margins.get(p.gpu.id)
    return m.word if m is not None else (FITS if j.fits[p.gpu.id] else NO)


def _headroom_lines(j: Judgement, p: GPUPlan, adv: Advice | None) -> list[str]:
    """What buys a tight job its margin: a recipe variant first, then the planner's knobs, each
    with what it gains on the peak."""
    m = j.margins[p.gpu.id]
    adv = adv or Advice()
    out = []
    for vf in adv.variants:
        out.append(
            f"  to buy the margin: {vf.flags} (peak {vf.peak_phase} {_g(vf.peak_bytes)} GiB, "
            f"{_g(m.peak_bytes - vf.peak_bytes)} GiB lower; host RAM about {vf.host_bytes / GIB:.0f} GiB)"
        )
    best = adv.best
    if best:
        out.append(
            f"  to buy the margin: {best.knob.name}: --set {' --set '.join(best.knob.sets)} "
            f"(the planner's peak {_g(best.plan.peak.total)} GiB, {_g(p.peak.total - best.plan.peak.total)} GiB lower; "
            f"host RAM about {host_bytes(best.knob.setup, j.fixes_off) / GIB:.0f} GiB)"
        )
    elif adv.path:
        out.append(
            f"  to buy the margin: {_path_text(adv.path)} (the planner's peak {_g(adv.path[-1].plan.peak.total)} GiB)"
        )
    if not out:
        out.append(f"  no recipe variant or knob of the planner buys {_g(m.band)} GiB on {p.gpu.id}")
    return out


def _path_text(steps: list[Suggestion]) -> str:
    """Knobs applied one after another as one change: each knob named once (with how many times
    it was applied) and each key set once, at the value the last step gave it."""
    names: dict[str, int] = {}
    sets: dict[str, str] = {}
    for st in steps:
        names[st.knob.name] = names.get(st.knob.name, 0) + 1
        for line in st.knob.sets:
            key, _, value = line.partition("=")
            sets[key] = value
    named = " + ".join(n if k == 1 else f"{n} (x{k})" for n, k in names.items())
    return f"{named}: --set " + " --set ".join(f"{k}={v}" for k, v in sets.items())


def _dominant_terms(ref: GPUPlan) -> list[str]:
    out = [f"dominant terms per phase ({ref.gpu.id}; the vLLM budget scales with the GPU):"]
    for ph in ref.phases:
        terms = ", ".join(f"{t.name} {_g(t.bytes)}" for t in ph.dominant(3))
        out.append(f"  {ph.phase:15s} {_g(ph.total):>6s}  {terms}")
    return out


def _advice_lines(j: Judgement, p: GPUPlan, adv: Advice | None) -> list[str]:
    """Why the job does not fit one GPU, and what does: a variant first, then knobs."""
    s = j.setup

    def ram(setup: Setup) -> str:
        return f"host RAM about {host_bytes(setup, j.fixes_off) / GIB:.0f} GiB"

    why = p.problems or [f"the calibrated prediction exceeds {_g(p.gpu.visible_bytes)} GiB"]
    out = [f"{p.gpu.id}: {NO}: " + "; ".join(why)]
    adv = adv or Advice()
    judged = adv.judged_against
    if judged is not None:
        out.append(
            f"  variants and knobs below are judged against {_g(judged.visible_bytes)} GiB: the planner's figure "
            f"plus the {_g(p.gpu.visible_bytes - judged.visible_bytes)} GiB the calibration adds must fit"
        )
    for vf in adv.variants:  # a variant the recipe ships comes before any knob
        out.append(variant_line(vf, judged or p.gpu))
    best = adv.best
    if best:
        then = "then fits" if best.plan.fits else f"still short by {_g(best.plan.shortfall)} GiB"
        out.append(
            f"  best single knob: {best.knob.name}: --set {' --set '.join(best.knob.sets)} "
            f"(saves {_g(best.saves)} GiB; {then}; {ram(best.knob.setup)})"
        )
    path, more = adv.path, adv.more_gpus_path
    for title, steps in ((f"to fit on {s.world} GPU(s)", path), ("to fit with more GPUs", more)):
        if steps:
            last = steps[-1]
            out.append(f"  {title}: {_path_text(steps)} (peak {_g(last.plan.peak.total)} GiB; {ram(last.knob.setup)})")
    if not path:
        out.append(
            f"  no combination of the planner's knobs fits on {s.world} GPU(s)"
            + ("" if more else ", nor with more GPUs")
        )
    return out


def _verdict_lines(j: Judgement) -> list[str]:
    s, out = j.setup, []
    for p in j.plans:
        m = j.margins.get(p.gpu.id)
        cal_line = verdict_line(p, j.calibrated.get(p.gpu.id), word=m.word if m is not None else None)
        if cal_line:
            out.append(cal_line)
        if j.fits[p.gpu.id]:
            out.append(
                f"{p.gpu.id}: the planner's highest phase {p.peak.phase} {_g(p.peak.total)} of "
                f"{_g(p.gpu.visible_bytes)} GiB; KV cache {p.kv_tokens} tokens "
                f"(batch: {p.batch_seqs_per_replica} sequences of {s.seq_len} per vLLM replica)"
            )
            if m is not None:
                out += margin_lines(m, p.gpu.id)
                if m.word == TIGHT:
                    out += _headroom_lines(j, p, j.headroom.get(p.gpu.id))
            continue
        out += _advice_lines(j, p, j.advice.get(p.gpu.id))
    return out


def host_lines(hp: HostPlan) -> list[str]:
    """The host block of `verl-recipes plan`."""
    out = ["host RAM of node 0, PREDICTED (GiB; PSS, with RSS beside it; verl_recipes/predict/host.py):"]
    for m in hp.moments:
        terms = ", ".join(f"{t.name} {_g(t.bytes)}" for t in m.dominant(3)) or "no model state"
        out.append(f"  {m.name:15s} {_g(m.pss):>6s} PSS {_g(m.rss):>6s} RSS  {terms}")
    pk = hp.peak
    if hp.cpu_backup_sync:
        sync = f"verl's merged LoRA sync copies the base weights to the CPU ({_g(hp.backup_bytes)} GiB)"
    elif hp.backup_bytes:
        sync = f"out-of-place merged sync, no CPU copy (--verl-fix-off {MERGE_FIX}: +{_g(hp.backup_bytes)} GiB)"
    else:
        sync = "no merged LoRA sync"
    rk = hp.rss_peak
    out.append(
        f"  peak: about {pk.pss / GIB:.0f} GiB PSS in {pk.name}, {rk.rss / GIB:.0f} GiB RSS in {rk.name}; "
        f"vLLM sleep level {hp.sleep_level}; {sync}"
    )
    out += [f"  note: {n}" for n in hp.notes]
    return out


#: the prefix of the FSDP process group's terms (`phases._group_terms`, `predict.fsdp_comm`)
GROUP_PREFIX = "trainer NCCL"


def group_lines(j: Judgement) -> list[str]:
    """What the real job's process group adds to every phase of a rank, per communicator: the part a
    rank rehearsal (`train --rank`, the fake group) cannot allocate, so its figure is the rest."""
    p = j.plans[0]
    terms = [t for t in p.peak.terms if t.name.startswith(GROUP_PREFIX) and t.bytes]
    if not terms:
        return []
    group = sum(t.bytes for t in terms)
    out = [
        f"real process group, per rank, PREDICTED: {group / GIB:.2f} GiB in every phase; a rank rehearsal allocates "
        f"none of it: its figure is the plan's less this ({(p.peak.total - group) / GIB:.2f} + "
        f"{group / GIB:.2f} = {p.peak.total / GIB:.2f} GiB at {p.peak.phase} on {p.gpu.id})"
    ]
    return out + [f"  {t.name[len('trainer ') :]}: {t.bytes / GIB:.2f} GiB" for t in terms]


def render_text(j: Judgement) -> str:
    out = [f"plan: {j.label}", *describe(j.setup), _constants_line(j.constants), ""]
    out += _peak_table(j)
    out += ["", *_dominant_terms(j.plans[0]), ""]
    group = group_lines(j)
    out += [*group, ""] if group else []
    out += _verdict_lines(j)
    out += ["", *host_lines(j.host)]
    if j.cost_lines:
        out += ["", *j.cost_lines]
    text = "\n".join(out)
    return text + f"\n{j.behind}" if j.behind else text


# ---- JSON -------------------------------------------------------------------------------------
def _knob_json(sg: Suggestion, fixes_off: tuple[str, ...]) -> dict[str, Any]:
    return {
        "name": sg.knob.name,
        "sets": list(sg.knob.sets),
        "saves_bytes": sg.saves,
        "peak_bytes": sg.plan.peak.total,
        "fits": sg.plan.fits,
        "host_bytes": host_bytes(sg.knob.setup, fixes_off),
    }


def _calibrated_json(cal: Calibrated | None) -> dict[str, Any] | None:
    if cal is None:
        return None
    return {"file": str(cal.path), "peak_bytes": cal.peak_bytes, "peak_phase": cal.peak_phase, "fits": cal.fits}


def _phases_json(p: GPUPlan) -> dict[str, Any]:
    return {
        ph.phase: {
            "total_bytes": ph.total,
            "by_process": ph.by_process(),
            "terms": [{"name": t.name, "bytes": t.bytes, "process": t.process} for t in ph.terms if t.bytes],
        }
        for ph in p.phases
    }


def _gpu_json(j: Judgement, p: GPUPlan) -> dict[str, Any]:
    adv = j.advice.get(p.gpu.id) or Advice()

    def knobs(steps: list[Suggestion] | None) -> list[dict[str, Any]] | None:
        return [_knob_json(x, j.fixes_off) for x in steps] if steps else None

    m = j.margins.get(p.gpu.id)
    return {
        "gpu": asdict(p.gpu),
        "verdict": _word(j, p),
        "margin": None
        if m is None
        else {
            "peak_phase": m.peak_phase,
            "peak_bytes": m.peak_bytes,
            "headroom_bytes": m.headroom,
            "band_bytes": m.band,
            "parts": [{"name": x.name, "bytes": x.bytes, "why": x.why} for x in m.parts],
            # what buys a tight job its margin: the recipe's variants, then the planner's knob
            "bought_by": [list(v.variants) for v in (j.headroom.get(p.gpu.id) or Advice()).variants],
            "bought_by_knob": _knob_json(h.best, j.fixes_off) if (h := j.headroom.get(p.gpu.id)) and h.best else None,
        },
        "fits": j.fits[p.gpu.id],
        "planner_fits": p.fits,
        "calibrated": _calibrated_json(j.calibrated.get(p.gpu.id)),
        "variants_that_fit": [
            {
                "variants": list(v.variants),
                "peak_bytes": v.peak_bytes,
                "peak_phase": v.peak_phase,
                "host_bytes": v.host_bytes,
            }
            for v in adv.variants
        ],
        "problems": p.problems,
        "peak_phase": p.peak.phase,
        "peak_bytes": p.peak.total,
        "vllm": {
            "budget_bytes": p.vllm_budget,
            "free_at_start_bytes": p.vllm_start_free,
            "kv_cache_bytes": p.kv_bytes,
            "kv_cache_tokens": p.kv_tokens,
            "max_model_len": p.max_model_len,
            "batch_sequences_per_replica": p.batch_seqs_per_replica,
        },
        "phases": _phases_json(p),
        "best_knob": _knob_json(adv.best, j.fixes_off) if adv.best else None,
        "path_to_fit": knobs(adv.path),
        "path_to_fit_more_gpus": knobs(adv.more_gpus_path),
    }


def host_json(hp: HostPlan) -> dict[str, object]:
    return {
        "predicted": True,
        "peak_moment": hp.peak.name,
        "peak_pss_bytes": hp.peak.pss,
        "peak_rss_moment": hp.rss_peak.name,
        "peak_rss_bytes": hp.rss_peak.rss,
        "cpu_backup_sync": hp.cpu_backup_sync,
        "merged_sync_backup_bytes": hp.backup_bytes,
        "vllm_sleep_level": hp.sleep_level,
        "moments": {
            m.name: {
                "pss_bytes": m.pss,
                "rss_bytes": m.rss,
                "base_pss_bytes": m.base_pss,
                "base_rss_bytes": m.base_rss,
                "terms": [{"name": t.name, "bytes": t.bytes} for t in m.terms if t.bytes],
            }
            for m in hp.moments
        },
        "notes": hp.notes,
    }


def plan_json(j: Judgement) -> dict[str, Any]:
    s = j.setup
    js: dict[str, Any] = {
        "target": j.label,
        "model": {"params": s.arch.params(), **asdict(s.arch)},
        "layout": describe(s),
        "constants": asdict(j.constants),
        "gpus": [_gpu_json(j, p) for p in j.plans],
        "host": host_json(j.host),
        "cost": j.cost_json,
    }
    group = [t for t in j.plans[0].peak.terms if t.name.startswith(GROUP_PREFIX) and t.bytes]
    if group:  # what a rank rehearsal's fake group cannot allocate, in every phase
        js["real_process_group"] = {
            "rehearsal_allocates": False,
            "bytes": sum(t.bytes for t in group),
            "terms": [{"name": t.name, "bytes": t.bytes} for t in group],
        }
    if j.behind:
        js["behind"] = j.behind
    return js
