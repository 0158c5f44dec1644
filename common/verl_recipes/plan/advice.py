"""The verdict a script can trust, and what to do when a job does not fit: one story per recipe.

Three sources can say whether a recipe fits a GPU, and they must not disagree in front of a user:

* the planner's own figure (`predict.phases`);
* a calibrated prediction committed for that recipe, variant set and layout
  (`recipes/<id>/expected/*.yaml`, `status: predicted`, written by `plan --from-layers` from
  truncated-depth runs): it corrects the planner by what real runs measured, so where one exists
  it decides the verdict, and the planner's figure is shown beside it;
* a committed run of exactly this job on that GPU kind (`measured`), more reliable still: its
  NVML peak decides where there is one;
* the recipe's variants: when the asked job does not fit, a variant that does is named first,
  with its peak and its host RAM, before any knob.

`whole_fix` is the one line a refusal ends with: every knob of the planner's path to fit, at
once, with the peak and host RAM it leads to, rather than the single knob that helps most.
`closing_line` is the preview's last line, which says the same thing as the plan above it, in
the same three words (`predict.margin`): a tight job is told its margin and what buys it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError
from verl_recipes.layout import RankSpec
from verl_recipes.paths import repo_root
from verl_recipes.plan.layers import layout_of
from verl_recipes.plan.runs import memory_run
from verl_recipes.predict.gpus import GPU, Budget, catalogue, parse_gpu
from verl_recipes.predict.host import plan_host
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.knobs import Suggestion, path_to_fit
from verl_recipes.predict.margin import FITS, NO, TIGHT, Margin, margin
from verl_recipes.predict.phases import Constants, GPUPlan, plan_gpu
from verl_recipes.predict.setup import load_setup
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.recipe.run_config import Composition
from verl_recipes.rundir import read_provenance

PREDICTED_SCHEMA = "verl-recipes/predicted/1"


@dataclass(frozen=True)
class Calibrated:
    """Evidence beyond the planner for one job on one GPU kind: a committed prediction
    (`plan --from-layers --write`) or a committed run of this very configuration on that GPU."""

    path: Path
    peak_bytes: int
    peak_phase: str
    fits: bool
    kind: str = "calibrated prediction"
    how: str = "from truncated-depth runs"


@dataclass(frozen=True)
class VariantFit:
    """A recipe variant (layered on the asked ones) and its plan on one GPU."""

    variants: tuple[str, ...]
    peak_bytes: int
    peak_phase: str
    host_bytes: int
    calibrated: Calibrated | None

    @property
    def flags(self) -> str:
        return " ".join(f"--variant {v}" for v in self.variants)


@dataclass(frozen=True)
class Advice:
    """What to change where a job does not fit one GPU: the recipe's variants that fit, first; then
    the knob that helps most and the planner's paths to fit, on the job's GPUs and with more.
    `judged_against` is the smaller card they are judged on where a calibration shows the planner
    short (`judged_gpu`)."""

    judged_against: GPU | None = None
    variants: list[VariantFit] = field(default_factory=list)
    best: Suggestion | None = None
    path: list[Suggestion] | None = None
    more_gpus_path: list[Suggestion] | None = None


def host_bytes(s: Setup, fixes_off: Sequence[str] = ()) -> int:
    """The planner's host RAM of node 0 for `s` (its PSS peak), the figure every suggestion shows."""
    return plan_host(s, fixes_off).peak.pss


def _gib(b: float) -> str:
    return f"{b / GIB:.1f}"


_EXPECTED: dict[tuple[str, int, int], Any] = {}


def _expected_doc(path: Path) -> Any:
    """A committed expected/*.yaml, parsed once per process while it is unchanged (the key is its
    path, modification time and size): `docs` asks `calibrated` for every recipe, variant and GPU,
    and each call reads every file of the recipe. Callers only read it."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _EXPECTED:
        try:
            _EXPECTED[key] = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as e:
            raise RecipeError(f"{path}: not valid YAML: {e}") from None
    return _EXPECTED[key]


def calibrated(recipe: Recipe | None, variants: Sequence[str], s: Setup, gpu: GPU) -> Calibrated | None:
    """The recipe's committed prediction for exactly this job on `gpu`, or None.

    A file matches when it predicts the same variants on the same catalogued GPU (or one exposing
    the same memory), with the same GPU count, nodes, depth and parallel layout; a truncated plan
    (`--layers`), another `--gpus` or a `--set` of another TP or PP is another job.
    """

    if recipe is None:
        return None
    for path in sorted((recipe.dir / "expected").glob("*.yaml")):
        doc = _expected_doc(path)
        if not isinstance(doc, dict) or doc.get("schema") != PREDICTED_SCHEMA:
            continue
        t = doc.get("target") or {}
        # the prediction depends on the GPU only through its visible memory (vLLM's budget is a
        # fraction of it): another card of the same size gets the same figure
        size = t.get("visible_gib")
        same = (
            (t.get("gpu") == gpu.id or (size is not None and abs(float(size) - gpu.visible_gib) < 0.05))
            and list(doc.get("variants") or []) == list(variants)
            and int(t.get("gpus") or 0) == s.world
            and int(t.get("nnodes") or 0) == s.nnodes
            and int(t.get("layers") or 0) == s.arch.layers
            # a --set that changes the parallel layout is another job
            and t.get("layout") in (None, layout_of(s))
        )
        if not same:
            continue
        pred = {str(k): float(v) for k, v in (doc.get("predicted_gib") or {}).items()}
        if not pred:
            continue
        phase = max(pred, key=lambda k: pred[k])
        peak = round(pred[phase] * GIB)
        fits = bool(doc.get("fits")) and peak <= gpu.visible_bytes
        fitted = (doc.get("fit") or {}).values()
        own = any(isinstance(f, dict) and f.get("decides") for f in fitted)
        depths = {int(d) for f in fitted if isinstance(f, dict) for d in f.get("depths") or []}
        if own and depths == {s.arch.layers}:
            how = "from a rank rehearsal of this layout at full depth"
        elif own:
            how = "from a rank rehearsal of this layout and truncated-depth runs"
        else:
            how = "from truncated-depth runs"
        return Calibrated(path, peak, phase, fits, how=how)
    return None


def measured(recipe: Recipe | None, s: Setup, gpu: GPU, run: Any = None) -> Calibrated | None:
    """The recipe's committed run of exactly this job on this GPU kind, as evidence (the most
    reliable: NVML's device peak over the whole run), or None. `run` is `plan.runs.memory_run`'s
    answer when the caller has it (finding it composes every committed run's config): a run that
    went without a fix of the start-up or of the step's time still held this job's memory."""

    if recipe is None:
        return None
    if run is None:
        run = memory_run(s, recipe.id)
    if run is None or read_provenance(run.run_dir).cap_gib is not None:
        return None
    if not gpu.runs_as(run.gpu_name):
        return None
    peaks = {ph: max(per.values()) for ph, per in run.phases.items() if per}
    if not peaks:
        return None
    phase = max(peaks, key=lambda k: peaks[k])
    return Calibrated(
        run.run_dir, peaks[phase], phase, peaks[phase] <= gpu.visible_bytes, "measured run", f"on {run.gpu_name}"
    )


def excess(plan: GPUPlan, cal: Calibrated | None) -> int:
    """Bytes the calibrated prediction adds to the planner's peak for this layout (0 without one)."""
    return max(0, cal.peak_bytes - plan.peak.total) if cal is not None else 0


def judged_gpu(gpu: GPU, extra: int) -> GPU:
    """The GPU a planner-only figure is judged against when this recipe's calibration shows the
    planner short by `extra` bytes: the same card, `extra` smaller. Knobs and variants are then
    suggested only where they would also fit the calibrated figure."""
    if extra <= 0:
        return gpu
    return replace(gpu, id=gpu.id, visible_bytes=gpu.visible_bytes - extra)


def verdict(plan: GPUPlan, cal: Calibrated | None) -> bool:
    """Whether the job fits: the calibrated prediction where one exists, else the planner."""
    return cal.fits if cal is not None else plan.fits


def verdict_margin(
    s: Setup, plan: GPUPlan, cal: Calibrated | None, c: Constants, doc: dict[str, Any] | None = None
) -> Margin:
    """The verdict on one GPU with the band that moves it, in `predict.margin`'s three words: the
    calibrated or measured figure where there is one, else the planner's, against the card. `plan`,
    the recipe tables and the table of verl's examples all say this one."""
    phase, peak = (cal.peak_phase, cal.peak_bytes) if cal is not None else (plan.peak.phase, plan.peak.total)
    return margin(
        s, phase, peak, plan.gpu.visible_bytes, c.nccl_bytes_per_communicator, starts=verdict(plan, cal), doc=doc
    )


def verdict_line(
    plan: GPUPlan, cal: Calibrated | None, root: Path | None = None, word: str | None = None
) -> str | None:
    """The line that puts a calibrated prediction beside the planner's figure, or None; `word` is the
    verdict with its margin (`verdict_margin`), else the figure against the card alone."""
    if cal is None:
        return None
    where = _rel(cal.path, root)
    return (
        f"{plan.gpu.id}: {cal.kind} ({where}, {cal.how}): "
        f"{cal.peak_phase} {_gib(cal.peak_bytes)} of {_gib(plan.gpu.visible_bytes)} GiB: "
        f"{word or (FITS if cal.fits else NO)}; the planner alone says {plan.peak.phase} "
        f"{_gib(plan.peak.total)} GiB; the verdict follows the {cal.kind.split()[0]} figure"
    )


def _rel(path: Path, root: Path | None) -> str:

    try:
        return str(path.resolve().relative_to((root or repo_root()).resolve()))
    except ValueError:
        return str(path)


def fitting_variants(recipe: Recipe | None, asked: Composition, gpu: GPU) -> list[VariantFit]:
    """The recipe's variants that fit `gpu` when added to the job's (or, where they do not compose
    with them, alone), composed as the job is otherwise, smallest peak first."""

    if recipe is None:
        return []
    out: list[VariantFit] = []
    c = Constants()
    variants, sets, fixes_off = asked.variants, asked.sets, asked.fixes_off
    for v in recipe.variants:
        if v in variants:
            continue
        for trial in ((*variants, v), (v,)):
            try:
                _, s, _ = load_setup(
                    recipe.id, list(trial), list(sets), layers=asked.layers, gpus=asked.gpus, fixes_off=fixes_off
                )
            except RecipeError:
                continue
            p = plan_gpu(s, gpu, c)
            cal = calibrated(recipe, trial, s, gpu)
            if verdict(p, cal):
                peak = cal.peak_bytes if cal else p.peak.total
                phase = cal.peak_phase if cal else p.peak.phase
                out.append(VariantFit(tuple(trial), peak, phase, host_bytes(s, fixes_off), cal))
            break
    return sorted(out, key=lambda f: f.peak_bytes)


def variant_line(f: VariantFit, gpu: GPU) -> str:
    src = "calibrated" if f.calibrated else "planner"
    return (
        f"  a recipe variant fits: {f.flags} (peak {f.peak_phase} {_gib(f.peak_bytes)} of "
        f"{_gib(gpu.visible_bytes)} GiB, {src}; host RAM about {f.host_bytes / GIB:.0f} GiB)"
    )


def whole_fix(s: Setup, gpu: GPU, fixes_off: Sequence[str] = ()) -> str:
    """Every knob the planner's path to fit needs, as one set of `--set`s, with the peak and host
    RAM it leads to; or what no knob can do."""

    c = Constants()
    for more, where in ((False, f"on {s.world} GPU(s)"), (True, "with more GPUs")):
        steps = path_to_fit(s, gpu, c, more_gpus=more)
        if steps:
            sets = " ".join(f"--set {x}" for st in steps for x in st.knob.sets)
            last = steps[-1]
            return (
                f"to fit {where}: {' + '.join(st.knob.name for st in steps)}: {sets} "
                f"(peak {_gib(last.plan.peak.total)} GiB, host RAM about "
                f"{host_bytes(last.knob.setup, fixes_off) / GIB:.0f} GiB)"
            )
    return f"no combination of the planner's knobs fits {gpu.id}, on {s.world} GPU(s) or more"


def closing_line(
    recipe: Recipe, asked: Composition, s: Setup, gpu: GPU, reason: str, rank: RankSpec | None = None
) -> str:
    """The preview's last line, judged on `gpu` (train's --gpu, else the recipe's per-GPU
    target) exactly as the plan above it: a job that fits is sent to a GPU host; one that does not
    names the variant that fits, else the whole fix, and is never told to just run. `rank`: a
    GPU host runs that rank of the job on one GPU."""
    p = plan_gpu(s, gpu)
    cal = calibrated(recipe, asked.variants, s, gpu)
    fixes_off = asked.fixes_off
    needs = f"one GPU, for {rank.label}" if rank else f"{s.world} x {gpu.id}"
    head = f"training needs an NVIDIA GPU ({needs}); {reason}."
    if verdict(p, cal):
        phase, peak = (cal.peak_phase, cal.peak_bytes) if cal else (p.peak.phase, p.peak.total)
        m = margin(s, phase, peak, gpu.visible_bytes, Constants().nccl_bytes_per_communicator)
        if m.word == FITS:
            return f"{head} The plan above fits {gpu.id}: run the same command on a GPU host to train."
        buy = fitting_variants(recipe, asked, judged_gpu(gpu, excess(p, cal) + m.band))
        with_it = (
            f"; {buy[0].flags} buys it (peak {_gib(buy[0].peak_bytes)} GiB): preview and train with it" if buy else ""
        )
        return (
            f"{head} The plan above is tight on {gpu.id}: {_gib(m.headroom)} GiB under the card, where "
            f"{_gib(m.band)} GiB is known to move the peak (`plan` states it){with_it}."
        )
    fits = fitting_variants(recipe, asked, gpu)
    if fits:
        f = fits[0]
        return (
            f"{head} As it stands the job does not fit {gpu.id}; {f.flags} does (peak "
            f"{_gib(f.peak_bytes)} GiB, host RAM about {f.host_bytes / GIB:.0f} GiB): preview and train with it."
        )
    return f"{head} As it stands the job does not fit {gpu.id}: {whole_fix(s, gpu, fixes_off)}."


def refusal(
    plan: GPUPlan, setup: Setup, label: str, fixes_off: Sequence[str] = (), cal: Calibrated | None = None
) -> str:
    """The one line a host refuses a job with that does not fit `gpu`, with the whole fix: every
    knob of the planner's path to fit at once (`plan.advice.whole_fix`), never one of several.
    Where the recipe commits a calibrated prediction for the job (`cal`), the reason is that figure
    and the fix is judged against the card less what the calibration adds, as `plan` judges it.
    `plan` is the planner's plan of `setup` on the GPU."""
    gpu = plan.gpu
    if cal is not None and not cal.fits:
        why = f"the {cal.kind} puts {cal.peak_phase} at {cal.peak_bytes / GIB:.1f} GiB"
        tip = f"; {whole_fix(setup, judged_gpu(gpu, excess(plan, cal)), fixes_off)}"
    else:
        why = plan.problems[0]
        tip = f"; {whole_fix(setup, gpu, fixes_off)}"
    return (
        f"predicted not to fit {label} ({gpu.visible_bytes / GIB:.1f} GiB): {why}{tip} "
        "(`verl-recipes plan` explains; --force runs anyway)"
    )


def _peak_text(plan: GPUPlan, cal: Calibrated | None) -> str:
    if cal is not None:
        return f"{cal.peak_phase} {cal.peak_bytes / GIB:.1f} GiB ({cal.kind})"
    return f"{plan.peak.phase} {plan.peak.total / GIB:.1f} GiB"


def _word(setup: Setup, plan: GPUPlan, cal: Calibrated | None) -> str:
    """`plan`'s word for a job under the card: fits, or tight with the margin it lacks
    (`predict.margin`); a tight job runs, and is told so."""
    phase, peak = (cal.peak_phase, cal.peak_bytes) if cal is not None else (plan.peak.phase, plan.peak.total)
    m = margin(setup, phase, peak, plan.gpu.visible_bytes, Constants().nccl_bytes_per_communicator)
    if m.word != TIGHT:
        return "fits"
    return (
        f"tight (under the card by {m.headroom / GIB:.1f} GiB, less than the {m.band / GIB:.1f} GiB "
        "`plan` states moves it) on"
    )


def fit_lines(
    setup: Setup,
    budgets: Sequence[Budget] | None,
    force: bool,
    fixes_off: Sequence[str] = (),
    recipe: Recipe | None = None,
    variants: Sequence[str] = (),
) -> list[str]:
    """The memory verdict: refuses (unless `force`) a job that fits none of `budgets`, or, without
    budgets, none of the planner's catalogue; returns the lines to print. `fixes_off` (the verl
    fixes the run goes without) sets the host RAM the refusal's fix states. A calibrated
    prediction `recipe` commits for exactly this job (its `variants`) decides, as it decides in
    `plan` (`plan.advice.verdict`): one verdict per job and GPU."""
    named = [(parse_gpu(b.gpu), b.label) for b in budgets or []]
    gpus = named or [(g, g.id) for g in catalogue().values()]
    cals = [calibrated(recipe, variants, setup, g) for g, _ in gpus]
    judged = [(plan_gpu(setup, g), g, label, cal) for (g, label), cal in zip(gpus, cals, strict=True)]
    fits = [(p, label, cal) for p, _, label, cal in judged if verdict(p, cal)]
    lines = [f"plan: {_word(setup, p, cal)} {label}: peak {_peak_text(p, cal)}" for p, label, cal in fits]
    short = [
        label + (f" ({_peak_text(p, cal)})" if cal is not None else "")
        for p, _, label, cal in judged
        if not verdict(p, cal)
    ]
    if fits and short:
        lines.append(f"plan: does not fit {', '.join(short)}: a host with one of those refuses it")
    if not fits:
        plan, _, label, cal = max(judged, key=lambda x: x[1].visible_bytes)
        where = label if budgets else f"even the largest GPU the planner knows, {label}"
        line = refusal(plan, setup, where, fixes_off, cal)
        if not force:
            raise RecipeError(line)
        lines.append(f"{line} [--force: going on]")
    return lines
