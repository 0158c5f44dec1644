"""Predict a full-depth configuration from runs of the same model truncated in depth.

    verl-recipes plan 70b-3d --gpu h100-80g --from-layers RUN_L2 RUN_L4 [RUN_PP2_L2 ...] \
        --write recipes/70b-3d/expected/h100x32-ppo.yaml

Why: a 70B model on 32 GPUs cannot be measured on the two GPUs we have, but the same widths with a
few layers can, and a decoder's memory per GPU is, phase by phase, a fixed part (embeddings and
LM head, logits, CUDA contexts, vLLM's budget, NCCL) plus a part per layer (weights, gradients,
optimizer states, activations). Two or more depths of one layout separate the two.

Method, per phase (the per-GPU peak: the heaviest GPU of each run):

1. Measured: a least-squares line through the runs of one layout (same TP, PP and widths),
   M(N) = a + b N, N = the run's number of layers.
2. Planner: the same runs re-planned from the config each one saved, P(N) = a_p + b_p N.
3. Calibration: k = b / b_p scales the planner's per-layer terms (what it gets wrong per layer),
   d = a - a_p corrects its fixed terms (an additive error: uncounted contexts or allocator blocks).
4. Target: the planner's full configuration on the target GPU, split the same way from two depths
   (the full depth and half of it): P_full(N) = A + B N. Prediction = A + d + k B N_full.

With several layouts (TP2, PP2) each gives a prediction; the file keeps each and the largest as
the one to plan with, unless runs of the target's own layout are among them (rank rehearsals of
the full job, `train --rank R`, at fewer layers or at full depth): per-layer errors measured on
another layout do not carry to this one (a TP1 x PP1 fit put 70b-3d's critic update at 85.8 GiB,
its rank 16 of TP4 x PP2 measured 75.4), so the target's own layout decides every phase it
measured. A phase measured at one depth only keeps the planner's per-layer terms and shifts its
fixed terms by what that depth measured (k = 1). A phase a run did not finish (it died inside it:
phases.jsonl's end marker says ok false) is not fitted: its peak is only how far it got. A rank of
the target's own layout at full depth on a card of the target's size is a floor for every phase
it measured, plus the planner's terms its rehearsal lacks (`_own_card_floors`). Such a rank
needs no second depth (nothing is carried across depths): runs of the target's own layout all at
the target's depth stand alone as one-depth phases, the planner's terms the rehearsal lacks added.
With exactly two depths the fit has no residual: the file says so, and a
third depth is what would measure the fit's own error. With three or more, the error band of a
phase is the range of its prediction over the lines through every two of the measured depths and
through all of them: a decoder whose memory is exactly linear in depth gives a band of zero width,
and what a residual at the measured depths does to the 80-layer figure is what the band shows.
The output is a prediction and is marked `status: predicted` (schema verl-recipes/predicted/1):
`verl-recipes check-bounds` refuses it as bounds, and the measured tables of the README never show it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError
from verl_recipes.plan.runs import MeasuredRun, read_run, run_setup
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.margin import FITS, NO
from verl_recipes.predict.phases import PHASES, Constants, plan_gpu
from verl_recipes.rundir import PHASES as PHASES_LOG
from verl_recipes.rundir import PROVENANCE, read_jsonl, read_provenance

SCHEMA = "verl-recipes/predicted/1"


@dataclass(frozen=True)
class Line:
    """y = intercept + slope x N (bytes, bytes per layer)."""

    intercept: float
    slope: float

    def at(self, n: float) -> float:
        return self.intercept + self.slope * n


def fit_line(points: list[tuple[int, float]]) -> Line:
    """Least squares through (layers, bytes); needs at least two distinct depths."""
    xs = [float(x) for x, _ in points]
    if len(set(xs)) < 2:
        raise RecipeError(f"runs at depths {sorted(set(int(x) for x in xs))}: need at least two different depths")
    mx, my = statistics.mean(xs), statistics.mean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for (x, y) in zip(xs, (p[1] for p in points), strict=True)) / sxx
    return Line(my - slope * mx, slope)


def _with_layers(s: Setup, n: int) -> Setup:
    return dataclasses.replace(s, arch=dataclasses.replace(s.arch, layers=n))


def layout_of(s: Setup) -> str:
    """The layout a prediction file names (`target.layout`): engine, TP, PP, CP, GPUs, vLLM's TP
    and the widths; a prediction holds for this layout only."""
    return _layout(s)


def _layout(s: Setup) -> str:
    a = s.actor
    widths = f"h{s.arch.hidden} f{s.arch.intermediate} heads{s.arch.heads}/{s.arch.kv_heads} v{s.arch.vocab}"
    return f"{a.backend} TP{a.tp} PP{a.pp} CP{a.cp} x {s.world} GPUs, vLLM TP{s.rollout.tp}, {widths}"


def unfinished(run_dir: Path) -> set[str]:
    """verl's phases the run entered and did not finish (their end marker says ok false), in the
    planner's names: a run that died inside a phase measured only how far that phase got."""

    path = run_dir / PHASES_LOG
    events = read_jsonl(path)[0] if path.is_file() else []
    return {
        str(ev["name"])
        for ev in events
        if ev.get("event") == "end" and ev.get("ok") is False and ev.get("name") != "step"
    }


def _peaks(run: MeasuredRun) -> dict[str, int]:
    """Per phase, the heaviest GPU's peak (the one that decides whether a card is big enough), less
    the phases the run did not finish."""
    cut = unfinished(run.run_dir)
    return {ph: max(per.values()) for ph, per in run.phases.items() if per and ph not in cut}


def _planned_peaks(s: Setup, gpu: GPU, c: Constants) -> dict[str, int]:
    plan = plan_gpu(s, gpu, c)
    out = {p.phase: p.total for p in plan.phases}
    if "update_weights" in out and "outside" in out:  # measured `outside` includes verl's first sync
        out["outside"] = max(out["outside"], out["update_weights"])
    return out


def _mean_measured(pairs: list[tuple[float, float]]) -> float:
    return statistics.mean(v for v, _ in pairs)


@dataclass
class LayoutFit:
    layout: str
    runs: list[str]
    depths: list[int]
    measured: dict[str, Line]
    planned: dict[str, Line]
    residual_gib: dict[str, float | None]  # largest |measured - fit| per phase; None with two depths
    points: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)  # (layers, bytes)
    #: phases measured at one depth only: (layers, measured bytes, planned bytes) of that depth
    single: dict[str, tuple[int, float, float]] = dataclasses.field(default_factory=dict)

    def lines(self, ph: str) -> list[Line]:
        """The measured line of `ph` through all depths, then through each two distinct depths
        (three or more depths only): what the error band carries to the target."""
        depths = sorted({x for x, _ in self.points.get(ph, [])})
        out = [self.measured[ph]]
        if len(depths) > 2:
            for i, a in enumerate(depths):
                for b in depths[i + 1 :]:
                    out.append(fit_line([pt for pt in self.points[ph] if pt[0] in (a, b)]))
        return out


def fit_layout(runs: list[MeasuredRun], c: Constants, one_depth: bool = False) -> LayoutFit:
    """Measured and planned lines per phase for runs of one layout. `one_depth`: runs at a single
    depth are accepted (the target's own layout at its own depth: no line is needed to reach it)."""
    setups = [run_setup(r) for r in runs]
    depths = [s.arch.layers for s in setups]
    # (phase, depth) -> rank -> [(measured, planned)]: repeats of one rank are averaged, and of
    # the ranks rehearsed at one depth the heaviest stands for the job (its peak per GPU is its
    # heaviest GPU's); a run of the whole job counts as one rank
    by_rank: dict[tuple[str, int], dict[int | None, list[tuple[float, float]]]] = {}
    for run, s in zip(runs, setups, strict=True):
        total = max(run.gpu_totals.values())
        gpu = GPU(id=run.gpu_name or "measured", name=run.gpu_name, memory_bytes=total, visible_bytes=total)
        plan_pk = _planned_peaks(s, gpu, c)
        rehearsal = run.provenance.rank_rehearsal
        rank = rehearsal.rank if rehearsal is not None else None
        for ph, v in _peaks(run).items():
            if ph in plan_pk:
                by_rank.setdefault((ph, s.arch.layers), {}).setdefault(rank, []).append((float(v), float(plan_pk[ph])))
    measured_pts: dict[str, list[tuple[int, float]]] = {}
    planned_pts: dict[str, list[tuple[int, float]]] = {}
    for (ph, n), ranks in by_rank.items():
        for pairs in ranks.values() if len(ranks) == 1 else [max(ranks.values(), key=_mean_measured)]:
            for got, want in pairs:
                measured_pts.setdefault(ph, []).append((n, got))
                planned_pts.setdefault(ph, []).append((n, want))
    measured = {ph: fit_line(p) for ph, p in measured_pts.items() if len({x for x, _ in p}) >= 2}
    if not measured and not one_depth:
        raise RecipeError(
            f"{_layout(setups[0])}: runs at depths {sorted(set(depths))}: need two different depths "
            "(or the target's own layout at the target's depth)"
        )
    single = {
        ph: (p[0][0], statistics.mean(y for _, y in p), statistics.mean(y for _, y in planned_pts[ph]))
        for ph, p in measured_pts.items()
        if ph not in measured
    }
    planned = {ph: fit_line(planned_pts[ph]) for ph in measured}
    residual: dict[str, float | None] = {}
    for ph, line in measured.items():
        pts = measured_pts[ph]
        residual[ph] = max(abs(y - line.at(x)) for x, y in pts) / GIB if len({x for x, _ in pts}) > 2 else None
    names = [str(r.run_dir) for r in runs]
    points = {ph: measured_pts[ph] for ph in measured}
    return LayoutFit(_layout(setups[0]), names, sorted(set(depths)), measured, planned, residual, points, single)


def group_runs(run_dirs: list[Path]) -> dict[str, list[MeasuredRun]]:
    """Runs by layout (parallel sizes and widths); depth is what varies inside a group."""
    groups: dict[str, list[MeasuredRun]] = {}
    for d in run_dirs:
        run = read_run(d)
        if not run.phases:
            raise RecipeError(f"{run.path}: no per-phase GPU peaks (NVML); a CPU preview cannot be fitted")
        groups.setdefault(_layout(run_setup(run)), []).append(run)
    return groups


def _own_card_floors(
    target: Setup, gpu: GPU, runs: list[MeasuredRun], full: dict[str, int], c: Constants
) -> dict[str, float]:
    """Per phase, GiB: what a rank of the target's own layout measured at the target's depth on a
    card of the target's size, plus the planner's terms its rehearsal lacks (the job's figure less
    the rank's). The line through the depths carries each phase as fixed plus per-layer parts; a
    phase whose peak changes regime with depth (`outside`: vLLM's start on a large card, Megatron's
    build of a whole model on a small one) it can carry below what the card itself showed."""
    out: dict[str, float] = {}
    for run in runs:
        s = run_setup(run)
        # a card of the target's size: within 1% (an A100's 80.0 GiB and an H100's 79.65 share a
        # regime; an H200's 140.4 does not), where vLLM's budget differs by half the gap
        if (
            s.arch.layers != target.arch.layers
            or abs(max(run.gpu_totals.values()) - gpu.visible_bytes) > gpu.visible_bytes / 100
        ):
            continue
        planned = _planned_peaks(s, gpu, c)
        for ph, got in _peaks(run).items():
            if ph in full and ph in planned:
                out[ph] = max(out.get(ph, 0.0), (got + full[ph] - planned[ph]) / GIB)
    return out


def predict(
    target: Setup, gpu: GPU, run_dirs: list[Path], c: Constants | None = None
) -> tuple[dict[str, Any], list[LayoutFit]]:
    """The calibrated per-phase prediction for `target` on `gpu`, and the fits behind it."""
    c = c or Constants()
    groups = group_runs(run_dirs)
    widths = {layout.split(", ")[-1] for layout in groups}
    mine = f"h{target.arch.hidden} f{target.arch.intermediate} heads{target.arch.heads}/{target.arch.kv_heads}"
    if any(not w.startswith(mine) for w in widths):
        raise RecipeError(f"the runs' widths ({'; '.join(sorted(widths))}) are not the target's ({mine}): no fit")
    n_full = target.arch.layers
    own_at_full = {
        layout
        for layout, runs in groups.items()
        if layout == _layout(target) and all(run_setup(r).arch.layers == n_full for r in runs)
    }
    fits = [fit_layout(runs, c, one_depth=layout in own_at_full) for layout, runs in groups.items()]
    half = n_full // 2 - (n_full // 2) % max(1, target.actor.pp)
    full = _planned_peaks(target, gpu, c)
    at_half = _planned_peaks(_with_layers(target, half), gpu, c)

    def carry(m: Line, p: Line, ph: str) -> float:
        slope_full = (full[ph] - at_half[ph]) / (n_full - half)
        fixed_full = full[ph] - slope_full * n_full
        k = m.slope / p.slope if p.slope else 1.0
        d = m.intercept - p.intercept
        return (fixed_full + d + k * slope_full * n_full) / GIB

    per_layout: dict[str, dict[str, float]] = {}
    bands: dict[str, dict[str, tuple[float, float]]] = {}  # layouts with three or more depths
    for f in fits:
        out: dict[str, float] = {}
        band: dict[str, tuple[float, float]] = {}
        for ph, m in f.measured.items():
            if ph not in full:
                continue
            out[ph] = carry(m, f.planned[ph], ph)
            each = [carry(line, f.planned[ph], ph) for line in f.lines(ph)]
            if len(each) > 1:
                band[ph] = (min(each), max(each))
        for ph, (_, m_one, p_one) in f.single.items():
            if ph in full:  # one depth: the planner's per-layer terms, its fixed terms shifted
                out[ph] = (full[ph] + m_one - p_one) / GIB
        per_layout[f.layout] = out
        if band:
            bands[f.layout] = band
    phases = [ph for ph in PHASES if any(ph in v for v in per_layout.values())]
    own = per_layout.get(_layout(target), {})
    predicted = {ph: own[ph] if ph in own else max(v[ph] for v in per_layout.values() if ph in v) for ph in phases}
    for ph, floor in _own_card_floors(target, gpu, groups.get(_layout(target), []), full, c).items():
        if ph in predicted and floor > predicted[ph]:
            predicted[ph] = floor
    peak_phase = max(predicted, key=lambda ph: predicted[ph])
    result: dict[str, Any] = {
        "planner_gib": {ph: round(full[ph] / GIB, 2) for ph in phases},
        "predicted_gib": {ph: round(v, 2) for ph, v in predicted.items()},
        "per_layout_gib": {k: {ph: round(v, 2) for ph, v in d.items()} for k, d in per_layout.items()},
        "peak_phase": peak_phase,
        "fits": predicted[peak_phase] * GIB <= gpu.visible_bytes,
    }
    # The prediction is the target layout's or the largest layout's, so its band is the range of
    # that one or of that maximum: a band only where every layout deciding the phase has one.
    band_gib: dict[str, list[float]] = {}
    for ph in phases:
        lays = [_layout(target)] if ph in own else [lay for lay, v in per_layout.items() if ph in v]
        if lays and all(ph in bands.get(lay, {}) for lay in lays):
            band_gib[ph] = [round(max(bands[lay][ph][i] for lay in lays), 2) for i in (0, 1)]
    if band_gib:
        result["band_gib"] = band_gib
        if peak_phase in band_gib:
            result["fits_across_band"] = band_gib[peak_phase][1] * GIB <= gpu.visible_bytes
    else:
        result["band_gib"] = None
    return result, fits


def document(
    recipe_id: str,
    variants: list[str],
    target: Setup,
    gpu: GPU,
    result: dict[str, Any],
    fits: list[LayoutFit],
    command: str,
) -> dict[str, Any]:
    """The predicted-bounds file: the prediction, the fit, and the runs behind it with provenance."""
    prov: dict[str, Any] = {}
    for f in fits:
        for r in f.runs:
            prov[r] = read_provenance(Path(r)).raw or {"missing": f"no {PROVENANCE} beside the run"}
    return {
        "schema": SCHEMA,
        "status": "predicted",
        "note": "Predicted from runs of fewer layers or of one rank, not measured as the whole job: the "
        "planner's full configuration with its per-layer terms scaled and its fixed terms shifted by "
        "what the runs measured; runs of the target's own layout decide the phases they measured "
        "(verl_recipes.plan.layers).",
        "recipe": recipe_id,
        "variants": variants,
        "target": {
            "gpu": gpu.id,
            "gpu_name": gpu.name,
            "visible_gib": round(gpu.visible_gib, 2),
            "gpus": target.world,
            "nnodes": target.nnodes,
            "layers": target.arch.layers,
            "layout": _layout(target),
        },
        **result,
        "fit": {
            f.layout: {
                "depths": f.depths,
                "runs": f.runs,
                "phases": {
                    ph: {
                        "measured_gib": round(m.intercept / GIB, 3),
                        "measured_gib_per_layer": round(m.slope / GIB, 4),
                        "planner_gib": round(f.planned[ph].intercept / GIB, 3),
                        "planner_gib_per_layer": round(f.planned[ph].slope / GIB, 4),
                        "max_residual_gib": f.residual_gib[ph],
                    }
                    for ph, m in f.measured.items()
                },
                **(
                    {
                        "one_depth": {
                            ph: {"layers": n, "measured_gib": round(m / GIB, 3), "planner_gib": round(p / GIB, 3)}
                            for ph, (n, m, p) in f.single.items()
                        }
                    }
                    if f.single
                    else {}
                ),
                **({"decides": "the target's own layout"} if f.layout == _layout(target) else {}),
            }
            for f in fits
        },
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "provenance": prov,
    }


def render(result: dict[str, Any], fits: list[LayoutFit], gpu: GPU, word: str | None = None) -> str:
    """The calibration's text; `word` is the verdict with its margin (`predict.margin`, as `plan`
    gives it), else the figure against the card alone."""
    lines = []
    for f in fits:
        depths = ", ".join(map(str, f.depths))
        lines.append(f"fit: {f.layout}; depths {depths}; {len(f.runs)} run(s)")
        for ph, m in f.measured.items():
            p = f.planned[ph]
            res = f.residual_gib[ph]
            lines.append(
                f"  {ph:15s} measured {m.intercept / GIB:6.2f} + {m.slope / GIB:6.3f}/layer   "
                f"planner {p.intercept / GIB:6.2f} + {p.slope / GIB:6.3f}/layer   "
                + (f"residual {res:.2f} GiB" if res is not None else "two depths: no residual")
            )
        for ph, (n, m_one, p_one) in f.single.items():
            lines.append(
                f"  {ph:15s} measured at {n} layers only: {m_one / GIB:6.2f}, planner {p_one / GIB:6.2f}: "
                "the planner's per-layer terms stand"
            )
    band = result.get("band_gib") or {}
    head = "predicted [error band]" if band else "predicted"
    lines.append(f"predicted per-GPU peak on {gpu.id} ({gpu.visible_gib:.1f} GiB), GiB: {head} (planner alone)")
    for ph, v in result["predicted_gib"].items():
        rng = f" [{band[ph][0]:.1f}, {band[ph][1]:.1f}]" if ph in band else ""
        lines.append(f"  {ph:15s} {v:7.1f}{rng} ({result['planner_gib'][ph]:.1f})")
    verdict = word or (FITS if result["fits"] else NO)
    peak = result["peak_phase"]
    tail = "" if band else f"; no error band ({'one depth' if all(len(f.depths) < 2 for f in fits) else 'two depths'})"
    if peak in band:
        lo, hi = band[peak]
        if hi <= gpu.visible_gib:
            tail = f"; fits across its error band [{lo:.1f}, {hi:.1f}]"
        elif lo > gpu.visible_gib:
            tail = f"; its whole error band [{lo:.1f}, {hi:.1f}] is over {gpu.visible_gib:.1f}"
        else:
            tail = f"; its error band [{lo:.1f}, {hi:.1f}] straddles {gpu.visible_gib:.1f}: no verdict"
    lines.append(f"{gpu.id}: {verdict}; peak {peak} {result['predicted_gib'][peak]:.1f} GiB{tail}")
    return "\n".join(lines)
