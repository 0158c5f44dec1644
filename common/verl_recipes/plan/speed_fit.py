"""The step-time model's fitted priors, regenerated from the committed runs: `predict/speed_fits.yaml`.

`predict/speed.py` prices a step as work (`speed.terms`: FLOPs, layer passes, decode roofline,
logits sampled) turned into seconds by priors (`speed.SpeedPriors`). Five of them are read here
from the runs with every fix on that changes the rate (`plan.speed_errors.judged_runs`, evidence
"rate": a run with verl's rollout poll or its own weight sync times verl's code, not the recipe's),
each re-planned at the tokens it logged and measured over steps 2+ (`judged_runs`, what
`plan.speed_errors` says):

- train_mfu and layer_pass_s, together, from every training phase of those runs;
- decode_efficiency and sample_s_per_logit, together, from their rollouts (`gen`);
- weight_sync_s, the median of their `update_weights`.

Four priors on a handful of configurations: the file says how many, and, for each configuration,
the step's error with its own runs left out of the fit, the figure to read before trusting a
prediction for a configuration unlike them.

Each pair is the point of a grid that makes the mean squared log(predicted / measured) least: a
ratio, so a 0.3 s phase weighs as much as a 15 s one, and squared, so the one configuration unlike
the others (a 0.5B model's many micro-batches, 256 sequences over a 151,936-token vocabulary) is
not outvoted by repeats of one 7B configuration, as a median would let it be. The file records the
runs, n and the spread of the log error it leaves, so a reader sees how much the fit rests on.
`verl-recipes plan --speed-errors --write FILE` rewrites it before the table is judged with it; the
model reads the file and never a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import inflight
from verl_recipes.paths import repo_root
from verl_recipes.plan.runs import MeasuredRun, committed_runs, judged_setup, lacks
from verl_recipes.predict.gpus import catalogued
from verl_recipes.predict.speed import FITS_SCHEMA, SpeedPriors, Terms, seconds, terms
from verl_recipes.recipe.compose import saved_config
from verl_recipes.rundir import CONFIG, steady_steps

#: where the data file sits in a checkout (the package's own copy is `speed.FITS_FILE`)
FIT_PATH = Path("common/verl_recipes/predict/speed_fits.yaml")

HEADER = """\
# The step-time model's fitted priors (verl_recipes/predict/speed.py reads `priors`).
# Generated: `verl-recipes plan --speed-errors --write validation/speed-errors.md` rewrites it from
# the runs named here (verl_recipes/plan/speed_fit.py says how); edit the runs, never the numbers.
"""

#: verl's timed phases the model prices, in the order a step runs them, then the whole step
PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights", "step")


@dataclass(frozen=True)
class Judged:
    """One run with what the model predicts for it."""

    label: str
    run: MeasuredRun
    terms: Terms
    measured: dict[str, float]
    steps: int
    rate_fixes_off: tuple[str, ...]
    configuration: str  # runs of one configuration on one card share it (`_configurations`)


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
    out: list[Judged] = []
    setups: dict[str, Any] = {}
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
        label = str(run.run_dir.relative_to(base))
        same = next((j.configuration for j in out if j.run.gpu_name == run.gpu_name and setups[j.label] == s), label)
        setups[label] = s
        out.append(Judged(label, run, t, measured, steps, lacks(run, s, "rate"), same))
    return out


TRAIN = ("old_log_prob", "ref", "values", "update_critic", "update_actor")


def _grid(lo: float, hi: float, n: int) -> list[float]:
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _best(
    judged: Sequence[Judged], phases: Sequence[str], base: SpeedPriors, axes: dict[str, list[float]]
) -> tuple[SpeedPriors, list[float]]:
    """The priors of the grid over `axes` (two names) that make the mean squared log(predicted /
    measured) over `phases` of `judged` least, and the log errors they leave."""
    (a, xs), (b, ys) = axes.items()
    best: tuple[float, SpeedPriors, list[float]] | None = None
    for x in xs:
        for y in ys:
            pr = replace(base, **{a: x, b: y})
            logs = _logs(judged, phases, pr)
            m = statistics.fmean(v * v for v in logs)
            if best is None or m < best[0]:
                best = (m, pr, logs)
    assert best is not None
    return best[1], best[2]


def _logs(judged: Sequence[Judged], phases: Sequence[str], pr: SpeedPriors) -> list[float]:
    out = []
    for j in judged:
        pred = seconds(j.terms, pr)
        out += [math.log(pred[ph] / j.measured[ph]) for ph in phases if ph in j.measured and ph in pred]
    return out


def _spread(logs: list[float]) -> dict[str, Any]:
    errs = sorted(math.exp(v) - 1 for v in logs)
    return {
        "n": len(errs),
        "median_abs_error": round(statistics.median(abs(e) for e in errs), 3),
        "min_error": round(errs[0], 3),
        "max_error": round(errs[-1], 3),
    }


def _priors(clean: Sequence[Judged]) -> tuple[SpeedPriors, list[float], list[float], list[float]]:
    """The fitted priors from `clean` (module docstring), the log errors of the training phases
    and of gen they leave, and the weight syncs."""
    pr, train_logs = _best(
        clean, TRAIN, SpeedPriors(), {"train_mfu": _grid(0.05, 0.60, 111), "layer_pass_s": _grid(0.0, 0.005, 101)}
    )
    pr, gen_logs = _best(
        clean,
        ("gen",),
        pr,
        {"decode_efficiency": _grid(0.30, 0.90, 61), "sample_s_per_logit": _grid(0.0, 1.0e-9, 101)},
    )
    syncs = [j.measured["update_weights"] for j in clean if "update_weights" in j.measured]
    return replace(pr, weight_sync_s=round(statistics.median(syncs), 2)), train_logs, gen_logs, syncs


def _held_out(clean: Sequence[Judged]) -> dict[str, str]:
    """Each configuration's step error when the fit leaves its runs out: how far the fit reaches
    beyond what it was fitted to (the median over its runs)."""
    out = {}
    for conf in dict.fromkeys(j.configuration for j in clean):
        pr = _priors([j for j in clean if j.configuration != conf])[0]
        errs = [
            sum(seconds(j.terms, pr).values()) / j.measured["step"] - 1
            for j in clean
            if j.configuration == conf and "step" in j.measured
        ]
        if errs:
            out[next(j.label for j in clean if j.configuration == conf)] = f"{statistics.median(errs):+.0%}"
    return out


def fit(judged: Sequence[Judged]) -> dict[str, Any]:
    """The data file's document from the judged runs (module docstring)."""
    clean = [j for j in judged if not j.rate_fixes_off]
    pr, train_logs, gen_logs, syncs = _priors(clean)
    rnd: Callable[[float], float] = lambda v: float(f"{v:.4g}")  # noqa: E731
    return {
        "schema": FITS_SCHEMA,
        "priors": {
            "train_mfu": rnd(pr.train_mfu),
            "layer_pass_s": rnd(pr.layer_pass_s),
            "decode_efficiency": rnd(pr.decode_efficiency),
            "sample_s_per_logit": rnd(pr.sample_s_per_logit),
            "weight_sync_s": pr.weight_sync_s,
        },
        "evidence": {
            "runs": [j.label for j in clean],
            "configurations": len({j.configuration for j in clean}),
            "training_phases": _spread(train_logs),
            "gen": _spread(gen_logs),
            "update_weights": {"n": len(syncs), "min_s": round(min(syncs), 2), "max_s": round(max(syncs), 2)},
            # the step's error for each configuration (named by its first run here) with its own runs
            # left out of the fit
            "step_error_held_out": _held_out(clean),
        },
    }


def render(doc: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False)


def write_fit(judged: Sequence[Judged], root: Path) -> Path:
    """Regenerate the checkout's data file in place from the judged runs."""
    path = root / FIT_PATH
    inflight.write_text(path, render(fit(judged)), "the step-time fit")
    return path
