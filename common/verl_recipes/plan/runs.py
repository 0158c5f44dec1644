"""The committed runs, as the planner and the docs read them: one reader of `recipes/*/results/`.

A committed run is a folder under `recipes/<id>/results/` with a summary.json (written by
`verl_recipes.measure.report`, read through `rundir.read_summary`), the verl_config.yaml it trained
with and its provenance.json. Every module that walks the committed results (the planner's checks
against measurements, the layer fit, its cost lookup, the README's tables) goes through
`committed_runs`, so what counts as a run is decided here: a run verl's trainer made. A monitored
run of another training loop (recipe verl-vs-deepspeed's DeepSpeed side: provenance.json
`backend: deepspeed`) has a summary and bounds of its own, but no verl configuration to re-plan,
and its memory is another framework's: the planner never holds it against verl's.

A run stands for a configuration where it trained that very configuration as a whole job, and for
one question at a time: its device peaks are the job's (`memory_run`, the measured verdict) unless
it went without a fix that changes the device's memory, its rate prices the job (`rate_run`) unless
it went without one that changes the rate (`fixes.concerns`). A run with verl's 2-second
rollout poll held the recipe's memory at a rate that is not the recipe's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError, rundir
from verl_recipes.fixes import EVERYTHING, Evidence, RunKind, concerning, recorded_off
from verl_recipes.paths import repo_root
from verl_recipes.predict.host import layered_fsdp1
from verl_recipes.predict.inputs import Setup, setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.recipe.compose import saved_config
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.rundir import CONFIG, MODEL_CONFIG, SUMMARY, Provenance, read_provenance, read_summary, steady_steps
from verl_recipes.workload.arch import arch_config_path


@dataclass
class MeasuredRun:
    path: Path  # the summary.json
    recipe: str  # the recipe id: the folder above results/ ("" outside a recipe)
    gpu_totals: dict[int, int]  # GPU index -> total memory, bytes
    gpu_name: str
    phases: dict[str, dict[int, int]]  # planner phase -> GPU index -> peak device bytes
    per_gpu_throughput: float | None = None  # verl's perf/throughput (tokens/s per GPU), median of steps 2+
    raw: dict[str, Any] = field(default_factory=dict)  # the summary as written

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    @property
    def provenance(self) -> Provenance:
        return read_provenance(self.run_dir)

    @property
    def longest_sequence(self) -> int | None:
        """The longest step's longest prompt plus its longest response, tokens, from verl's own
        metrics (`prompt_length/max` + `response_length/max` in verl_metrics.jsonl, per step): what
        the run's micro-batches were padded to at most. None for a run that logged no step."""
        rows, _ = rundir.read_jsonl(self.run_dir / rundir.VERL_METRICS)
        lens = [
            int(d["prompt_length/max"] + d["response_length/max"])
            for r in rows
            if "prompt_length/max" in (d := r.get("data", r)) and "response_length/max" in d
        ]
        return max(lens) if lens else None

    @property
    def steps_run(self) -> int:
        """The steps the run's summary holds (a run that died in its first step holds that one)."""
        return len(self.raw.get("steps") or [])

    @property
    def mean_lengths(self) -> tuple[float, float] | None:
        """The mean prompt and response tokens of steps 2+ (every step of a one-step run), from
        verl's `prompt_length/mean` and `response_length/mean`: the tokens the run's steps
        generated and trained on; None for a run that logged no step."""
        rows, _ = rundir.read_jsonl(self.run_dir / rundir.VERL_METRICS)
        steps = [
            (int(r.get("step") or 0), d)
            for r in rows
            if "prompt_length/mean" in (d := r.get("data", r)) and "response_length/mean" in d
        ]
        steady = [d for n, d in steps if n >= rundir.STEADY_FROM] or [d for _, d in steps]
        if not steady:
            return None
        return (
            statistics.mean(float(d["prompt_length/mean"]) for d in steady),
            statistics.mean(float(d["response_length/mean"]) for d in steady),
        )

    @property
    def fixes_off(self) -> tuple[str, ...]:
        """The verl fixes the run ran without (`fixes.recorded_off`)."""
        return recorded_off(self.provenance)


def read_run(run_dir: Path) -> MeasuredRun:
    """A run's summary as the planner needs it."""
    s = read_summary(run_dir)
    path = run_dir / SUMMARY
    totals = {int(g["index"]): round(float(g["total_gib"]) * GIB) for g in s.get("gpus") or []}
    phases: dict[str, dict[int, int]] = {}
    for name, pk in (s.get("phases") or {}).items():
        per = {int(i): round(float(g["used_gib"]) * GIB) for i, g in (pk.get("gpu") or {}).items()}
        if per:
            phases[name] = per
    # the median of steps 2+, the figure bounds, compare-runs and the results tables give
    rates = [x for st in steady_steps(s.get("steps") or []) if (x := st.get("throughput"))]
    parts = path.parts
    recipe = parts[len(parts) - 1 - parts[::-1].index("results") - 1] if "results" in parts else ""
    gpus = s.get("gpus") or []
    name = str(gpus[0].get("name", "")) if gpus else ""
    return MeasuredRun(path, recipe, totals, name, phases, statistics.median(rates) if rates else None, dict(s))


def results_dir(recipe_dir: Path) -> Path:
    """Where a recipe's committed runs live."""
    return recipe_dir / "results"


#: where runs of verl's own example scripts (`train --verl-example`) are committed: they belong to no
#: recipe, and the planner is held to them as to a recipe's runs
VERL_EXAMPLES = "validation/verl-examples"


def committed_runs(root: Path | None = None, recipe: str | None = None) -> list[MeasuredRun]:
    """Every committed run of verl's trainer with a summary (of one recipe, with `recipe`; without
    it, the runs of verl's example scripts too), in path order; runs of another training loop are
    left out (module docstring)."""

    base = root or repo_root()
    dirs = sorted(base.glob(f"recipes/{recipe or '*'}"))
    if recipe is None:
        dirs.append(base / VERL_EXAMPLES)
    found = [d for parent in dirs for d in rundir.measured_runs(results_dir(parent))]
    return [read_run(d) for d in found if read_provenance(d).verl]


def run_setup(run: MeasuredRun) -> Any:
    """The Setup the run trained with, from the verl_config.yaml the launcher saved beside it and
    the model's config.json (`model_config.json` beside it, else the one at the config's model
    path, else the recipe's bundled architecture)."""
    from omegaconf import OmegaConf

    saved = run.run_dir / CONFIG
    if not saved.is_file():
        raise RecipeError(f"{run.path}: no verl_config.yaml beside it; commit the one `verl-recipes train` saved")
    cfg = _saved_config(saved)
    model_path = OmegaConf.select(cfg, "actor_rollout_ref.model.path")
    for cand in (run.run_dir / MODEL_CONFIG, Path(str(model_path or "/nonexistent")) / "config.json"):
        if cand.is_file():
            arch = Arch.from_file(cand)
            break
    else:
        arch = Arch.from_file(arch_config_path(get_recipe(run.recipe).model.arch))
    setup = setup_from_config(cfg, arch, run.fixes_off)
    rehearsal = run.provenance.rank_rehearsal
    return replace(setup, fake_group=True).with_rank(rehearsal) if rehearsal else setup


def judged_setup(run: MeasuredRun) -> Any:
    """The Setup a run is held against: the one it trained with, its trainer's micro-batches sized at
    the longest sequence it logged (`Setup.logged_seq_len`) rather than the configuration's bound,
    and a run of one step as its first step (`Setup.first_step`: no AdamW moments before its update)."""
    return replace(run_setup(run), logged_seq_len=run.longest_sequence, first_step=run.steps_run == 1)


def _saved_config(path: Path) -> Any:
    """A run's saved verl_config.yaml, shared read-only with every other reader in the process."""

    return saved_config(path)


def residual_line(what: str, residuals: dict[str, list[int]]) -> str:
    """The mean of (measured - predicted) bytes per phase or moment: the data to refit `what` from."""
    means = ", ".join(f"{k} {statistics.mean(v) / GIB:+.2f}" for k, v in sorted(residuals.items()))
    return f"mean residual (measured - predicted), GiB, to refit {what} from: {means}"


#: the critic model's switch to verl's padding-free path; the actor's is `Setup.remove_padding`
_CRITIC_PADDING_FREE = "critic.model.use_remove_padding"


def run_kind(run: MeasuredRun, s: Setup) -> RunKind:
    """What of verl's code the run executed (`fixes.RunKind`), from `s`, the Setup it
    trained: its engine, its critic, its adapter sync (`host.layered_fsdp1`), and whether a model
    took verl's padding-free path, the actor's (`Setup.remove_padding`) or the critic's own
    `use_remove_padding` in its saved verl_config.yaml (verl's default, true, where the file
    leaves it out)."""
    from omegaconf import OmegaConf

    critic_free = s.critic is not None and bool(
        OmegaConf.select(_saved_config(run.run_dir / CONFIG), _CRITIC_PADDING_FREE, default=True)
    )
    return RunKind(s.backend, s.remove_padding or critic_free, s.critic is not None, layered_fsdp1(s))


def lacks(run: MeasuredRun, s: Setup, what: Evidence) -> tuple[str, ...]:
    """The fixes the run went without that make it wrong evidence for `what`
    (`fixes.concerns`): a fix of the start-up leaves its device memory and its rate as good as
    a fixed run's, one of the step's wait leaves its memory, and one of code the run never executes
    (the other engine's, the padding-free path's, a critic's) leaves everything."""
    return concerning(run.fixes_off, what, run_kind(run, s))


def fully_fixed(run: MeasuredRun, s: Setup) -> bool:
    """Whether the run went without no fix that changes anything it measured."""
    return not any(lacks(run, s, what) for what in EVERYTHING)


def trained_runs(recipe_id: str) -> list[tuple[MeasuredRun, Setup]]:
    """(run, the Setup it trained) for every committed run of the recipe that trained steps (it
    measured a rate), whatever fixes it went without; a run without its saved config is left out."""
    out = []
    for run in committed_runs(recipe=recipe_id):
        if not run.per_gpu_throughput:
            continue
        try:
            out.append((run, run_setup(run)))
        except RecipeError:
            continue
    return out


def fixed_runs(recipe_id: str, what: Evidence) -> list[tuple[MeasuredRun, Setup]]:
    """`trained_runs` with every fix on that changes `what` for them (`lacks`): the runs that are
    evidence for `what` of the configuration they trained."""
    return [(run, rs) for run, rs in trained_runs(recipe_id) if not lacks(run, rs, what)]


def _newest_of_this_job(s: Setup, runs: list[tuple[MeasuredRun, Setup]]) -> MeasuredRun | None:
    """The run of `runs` that stands for this very configuration (the same Setup, read back from
    its saved verl_config.yaml) as a whole job: a fully fixed one before one that went without a
    fix the question leaves alone, then the newest. A rank rehearsal is one rank with no
    communication and a fake process group, never the job."""
    same = [
        (fully_fixed(run, rs), run.provenance.date_utc or "", run.run_dir.name, run)
        for run, rs in runs
        if rs == s and run.provenance.rank_rehearsal is None
    ]
    return max(same, key=lambda t: t[:3])[3] if same else None


def rate_run(s: Setup, recipe_id: str) -> MeasuredRun | None:
    """The committed run whose rate prices `s`: the newest that trained this very configuration
    with every fix on that changes the rate. A run of another variant, batch or weight sync would
    price a job the user did not ask for (verl's own sync runs 2-3x slower than the recipe's), and
    so would one with verl's 2-second rollout poll."""
    return _newest_of_this_job(s, fixed_runs(recipe_id, "rate"))


def memory_run(s: Setup, recipe_id: str) -> MeasuredRun | None:
    """The committed run whose device peaks stand for `s` (`plan.advice.measured`): the newest that
    trained this very configuration with every fix on that changes the device's memory. One that
    went without a fix of the start-up or of the rollout's wait held the same memory."""
    return _newest_of_this_job(s, fixed_runs(recipe_id, "device memory"))


def unpriced_runs(s: Setup, recipe_id: str) -> list[tuple[MeasuredRun, tuple[str, ...]]]:
    """(run, the fixes it went without that change the rate) for each committed run of this very
    configuration, as a whole job, whose rate prices nothing (`rate_run`), the newest first: what
    the cost line names when no run prices the job."""
    out = [
        (run.provenance.date_utc or "", run.run_dir.name, run, off)
        for run, rs in trained_runs(recipe_id)
        if rs == s and run.provenance.rank_rehearsal is None and (off := lacks(run, rs, "rate"))
    ]
    return [(run, off) for *_, run, off in sorted(out, key=lambda t: t[:2], reverse=True)]


def capped_runs(s: Setup, recipe_id: str) -> list[MeasuredRun]:
    """Committed runs of this configuration made under `train --cap-gib`: the same Setup but for
    vLLM's gpu_memory_utilization, which the cap rescales to a fraction of the larger GPU, with
    every fix on that changes the device's memory. They measure a card of the cap's size in memory
    only: their rate is the larger GPU's compute behind a smaller KV cache, a rate no card of that
    size has, so it prices nothing."""

    util = s.rollout.gpu_memory_utilization
    out = [
        run
        for run, rs in fixed_runs(recipe_id, "device memory")
        if run.provenance.cap_gib is not None
        and replace(rs, rollout=replace(rs.rollout, gpu_memory_utilization=util), notes=s.notes) == s
    ]
    return sorted(out, key=lambda r: r.run_dir.name)
