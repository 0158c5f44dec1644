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

`--write FILE` first regenerates the step-time model's fitted priors from these runs
(`plan.speed_fit`, the data file `predict/speed_fits.yaml`), then writes the table judged with
them (validation/speed-errors.md is the committed one). The runs are read and priced in
`plan.speed_fit.judged_runs`, the one reader both use.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError, inflight
from verl_recipes.paths import repo_root
from verl_recipes.plan.speed_fit import PHASES, Judged, judged_runs, write_fit
from verl_recipes.predict.speed import SpeedPriors, load_priors, seconds


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
        "The priors beyond the roofline are fitted to the runs with every fix on that changes the rate "
        "(`verl_recipes/plan/speed_fit.py`, `predict/speed_fits.yaml`): those rows are the fit's own; "
        "each configuration's step error with its runs left out of the fit is the file's "
        "`step_error_held_out`. A run without such a fix (last column) times verl's slower code "
        "(its 2-second rollout poll, its own weight sync, unchunked log-probabilities): the model "
        "prices the recipe's, so those rows read low.\n",
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
        inflight.check_folder(write, "the speed error table")
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
