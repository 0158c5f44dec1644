"""The step-time model's error against measured runs: `verl-recipes plan --speed-errors`.

`predict/speed.py` PREDICTS a step's seconds per phase; nothing else holds those figures to a run.
Every committed run of a whole job (`plan.runs.committed_runs`, without rank rehearsals: a
rehearsed rank's step is one rank's compute with no communication, never the job's) whose summary
carries verl's per-step `timing_s` is re-planned as `plan --errors` re-plans it (`judged_setup`:
the verl_config.yaml it trained, its model's config.json) on the catalogued card NVML named, at the
prompt and response tokens it logged (the means of verl's `prompt_length/mean` and
`response_length/mean` over steps 2+: `MeasuredRun.mean_lengths`), and each phase verl timed is
compared:

    error = (predicted - measured) / measured

The measured figure is the median of steps 2 onwards (`rundir.steady_steps`): step 1 carries
vLLM's CUDA-graph capture, torch.compile, the allocator's warm-up and the first weight sync's
buffers; a run of one step is read at that step. `step` is verl's whole step (it includes the
reward, the advantage and the trainer's own bookkeeping, which the model does not price), against
the sum of the predicted phases.

A run that went without a fix that changes the rate (`plan.runs.lacks`, evidence "rate": verl's
2-second rollout poll, its own weight sync) is listed with those fixes: its time is verl's, not
the recipe's, and a large error there is the fix's absence. The summary gives, per phase, n and the
median, 10th and 90th percentile of the error over every row and over the rows of runs with every
rate fix on.

`--write FILE` writes the table (validation/speed-errors.md is the committed one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError, inflight
from verl_recipes.paths import repo_root
from verl_recipes.plan.runs import MeasuredRun, committed_runs, judged_setup, lacks
from verl_recipes.predict.gpus import catalogued
from verl_recipes.predict.speed import SpeedPriors, Terms, load_priors, seconds, terms
from verl_recipes.recipe.compose import saved_config
from verl_recipes.rundir import CONFIG, steady_steps

#: verl's timed phases the model prices, in the order a step runs them, then the whole step
PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights", "step")


@dataclass(frozen=True)
class Row:
    run: str
    phase: str
    measured: float  # seconds, median of steps 2+
    predicted: float | None  # seconds, PREDICTED; None where the model prices no such phase
    steps: int  # the steps the median is of
    rate_fixes_off: tuple[str, ...]  # fixes the run went without that change the rate

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class Judged:
    """One run with what the model predicts for it."""

    label: str
    run: MeasuredRun
    terms: Terms
    measured: dict[str, float]
    steps: int
    rate_fixes_off: tuple[str, ...]


def measured_phases(run: MeasuredRun) -> tuple[dict[str, float], int]:
    """verl's `timing_s` per phase, the median of steps 2+ (a one-step run: its step), and the
    number of steps read; empty where no step was timed."""
    timed = [st for st in steady_steps(run.raw.get("steps") or []) if st.get("timing_s")]
    out: dict[str, float] = {}
    for ph in PHASES:
        vals = [float(v) for st in timed if (v := st["timing_s"].get(ph)) is not None]
        if vals:
            out[ph] = statistics.median(vals)
    return out, len(timed)


def _bypass(run: MeasuredRun) -> bool:
    """Whether the run took the rollout's log-probabilities for the actor's (verl's
    `algorithm.rollout_correction.bypass_mode`): its old_log_prob recomputes nothing."""
    from omegaconf import OmegaConf

    cfg = saved_config(run.run_dir / CONFIG)
    return bool(OmegaConf.select(cfg, "algorithm.rollout_correction.bypass_mode", default=False))


def judged_runs(root: Path | None = None) -> list[Judged]:
    """Every committed whole-job run with timed steps on a catalogued card, with the work the
    model prices for it (`speed.terms`)."""
    base = root or repo_root()
    out = []
    for run in committed_runs(base):
        if run.provenance.rank_rehearsal is not None:
            continue
        measured, steps = measured_phases(run)
        gpu = catalogued(run.gpu_name)
        lengths = run.mean_lengths
        if not measured or gpu is None or lengths is None:
            continue
        s = judged_setup(run)
        t = terms(s, gpu, round(lengths[0]), round(lengths[1]), not _bypass(run))
        out.append(Judged(str(run.run_dir.relative_to(base)), run, t, measured, steps, lacks(run, s, "rate")))
    return out


def speed_rows(judged: list[Judged], priors: SpeedPriors) -> list[Row]:
    """Predicted against measured, every timed phase of every run, with `priors`."""
    rows = []
    for j in judged:
        predicted = seconds(j.terms, priors)
        for ph in PHASES:
            if ph not in j.measured:
                continue
            pred = sum(predicted.values()) if ph == "step" else predicted.get(ph)
            rows.append(Row(j.label, ph, j.measured[ph], pred, j.steps, j.rate_fixes_off))
    return rows


def _pct(vals: list[float], q: float) -> float:
    v = sorted(vals)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def summary(rows: list[Row]) -> list[str]:
    """Per phase: n, median, 10th and 90th percentile of the error, median |error|; over every row
    and over runs with every rate fix on."""
    out = []
    for title, keep in (("every run", lambda r: True), ("runs with every rate fix on", lambda r: not r.rate_fixes_off)):
        out.append(f"{title}:")
        for ph in PHASES:
            errs = [e for r in rows if r.phase == ph and keep(r) and (e := r.error) is not None]
            unpriced = sum(1 for r in rows if r.phase == ph and keep(r) and r.error is None)
            if not errs:
                if unpriced:
                    out.append(f"  {ph}: n {unpriced}, not predicted")
                continue
            absm = statistics.median(abs(e) for e in errs)
            out.append(
                f"  {ph}: n {len(errs)}, median {statistics.median(errs):+.0%}, 10th-90th percentile "
                f"{_pct(errs, 0.1):+.0%} to {_pct(errs, 0.9):+.0%}, median |error| {absm:.0%}"
            )
    return out


def format_table(rows: list[Row]) -> str:
    out = [f"{'run':48s} {'phase':15s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in rows:
        pred = "-" if r.predicted is None else f"{r.predicted:9.2f}"
        err = "-" if (e := r.error) is None else f"{e:+7.0%}"
        out.append(f"{r.run:48s} {r.phase:15s} {r.measured:9.2f} {pred:>9s} {err:>7s}")
    return "\n".join(out + summary(rows))


def markdown(rows: list[Row], priors: SpeedPriors) -> str:
    out = [
        "# The step-time model against every committed run\n",
        "Generated by `verl-recipes plan --speed-errors --write validation/speed-errors.md` "
        "(verl_recipes/plan/speed_errors.py says what is compared). Measured: verl's `timing_s`, the "
        "median of steps 2+ (step 1 carries warm-up; a one-step run is read at its step). Predicted: "
        "`verl_recipes/predict/speed.py` for the run's own configuration at the tokens it logged, every "
        "figure a PREDICTION. error = (predicted - measured) / measured. Whole jobs only: a rank "
        "rehearsal's step is one rank's compute.\n",
        f"Priors: {priors.describe()}.\n",
        "## Summary\n",
        "```",
        *summary(rows),
        "```\n",
        "## Every phase of every run\n",
        "| run | phase | steps | measured s | predicted s | error | fixes off that change the rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pred = "not predicted" if r.predicted is None else f"{r.predicted:.2f}"
        err = "" if (e := r.error) is None else f"{e:+.0%}"
        out.append(
            f"| {r.run} | {r.phase} | {r.steps} | {r.measured:.2f} | {pred} | {err} | {', '.join(r.rate_fixes_off)} |"
        )
    return "\n".join(out) + "\n"


def main_speed_errors(write: Path | None = None, root: Path | None = None) -> int:
    """`plan --speed-errors [--write FILE]`."""
    base = root or repo_root()
    priors = load_priors()
    judged = judged_runs(base)
    if write is not None:  # the fit first: the table is judged with it
        from verl_recipes.plan.speed_fit import write_fit

        fit_file = write_fit(judged, base)
        print(f"wrote {fit_file}")
        priors = load_priors(fit_file)
    rows = speed_rows(judged, priors)
    if not rows:
        raise RecipeError("plan --speed-errors: no committed whole-job run with verl's step timings")
    print(format_table(rows))
    if write is not None:
        inflight.write_text(write, markdown(rows, priors), "the speed error table")
        print(f"wrote {write}")
    return 0
