"""The committed runs, as the planner and the docs read them: one reader of `recipes/*/results/`.

A committed run is a folder under `recipes/<id>/results/` with a summary.json (written by
`verl_recipes.measure.report`, read through `rundir.read_summary`), the verl_config.yaml it trained
with and its provenance.json. Every module that walks the committed results (the planner's checks
against measurements, the layer fit, its cost lookup, the README's tables) goes through
`committed_runs`, so what counts as a run is decided here: a run verl's trainer made. A monitored
run of another training loop (recipe verl-vs-deepspeed's DeepSpeed side: provenance.json
`backend: deepspeed`) has a summary and bounds of its own, but no verl configuration to re-plan,
and its memory is another framework's: the planner never holds it against verl's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError, rundir
from verl_recipes.plan.inputs import Setup
from verl_recipes.rundir import CONFIG, MODEL_CONFIG, SUMMARY, Provenance, read_provenance, read_summary, steady_steps
from verl_recipes.worker.verl_fixes import recorded_off

# The report's phase names (verl's marked_timer names) -> the planner's. `outside` is all time
# outside every step: model loading and vLLM start-up, which the planner calls `loaded`.
_ALIASES = {"outside": "loaded"}


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
    def fixes_off(self) -> tuple[str, ...]:
        """The verl fixes the run ran without (`verl_fixes.recorded_off`)."""
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
            phases[_ALIASES.get(name, name)] = per
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


def committed_runs(root: Path | None = None, recipe: str | None = None) -> list[MeasuredRun]:
    """Every committed run of verl's trainer with a summary (of one recipe, with `recipe`), in path
    order; runs of another training loop are left out (module docstring)."""
    from verl_recipes.paths import repo_root

    base = root or repo_root()
    pattern = f"recipes/{recipe or '*'}"
    return [
        read_run(d)
        for recipe_dir in sorted(base.glob(pattern))
        for d in rundir.measured_runs(results_dir(recipe_dir))
        if read_provenance(d).verl
    ]


def run_setup(run: MeasuredRun) -> Any:
    """The Setup the run trained with, from the verl_config.yaml the launcher saved beside it and
    the model's config.json (`model_config.json` beside it, else the one at the config's model
    path, else the recipe's bundled architecture)."""
    from omegaconf import OmegaConf

    from verl_recipes.plan.inputs import setup_from_config
    from verl_recipes.plan.model import Arch
    from verl_recipes.workload.arch import arch_config_path

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
        from verl_recipes.recipe.metadata import get_recipe

        arch = Arch.from_file(arch_config_path(get_recipe(run.recipe).model.arch))
    setup = setup_from_config(cfg, arch, run.fixes_off)
    rehearsal = run.provenance.rank_rehearsal
    return replace(setup, fake_group=True).with_rank(rehearsal[0]) if rehearsal else setup


def judged_setup(run: MeasuredRun) -> Any:
    """The Setup a run is held against: the one it trained with, its trainer's micro-batches sized at
    the longest sequence it logged (`Setup.logged_seq_len`) rather than the configuration's bound."""
    return replace(run_setup(run), logged_seq_len=run.longest_sequence)


_SAVED: dict[tuple[str, int, int], Any] = {}


def _saved_config(path: Path) -> Any:
    """A run's saved verl_config.yaml, read once per process while the file is unchanged (the key
    is its path, modification time and size): `plan` reads every committed run of the recipe for
    its verdict and again for its cost line, and parsing the YAML is most of its time. Read-only,
    since every reader shares it."""
    from omegaconf import OmegaConf

    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _SAVED:
        cfg = OmegaConf.load(path)
        OmegaConf.set_readonly(cfg, True)
        _SAVED[key] = cfg
    return _SAVED[key]


def residual_line(what: str, residuals: dict[str, list[int]]) -> str:
    """The mean of (measured - predicted) bytes per phase or moment: the data to refit `what` from."""
    means = ", ".join(f"{k} {statistics.mean(v) / GIB:+.2f}" for k, v in sorted(residuals.items()))
    return f"mean residual (measured - predicted), GiB, to refit {what} from: {means}"


def fixed_runs(recipe_id: str) -> list[tuple[Any, Any]]:
    """(run, the Setup it trained) for every committed run of the recipe that measured a rate on
    verl's code with every fix of the recipe on."""
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.worker.verl_fixes import concerns

    backend = get_recipe(recipe_id).backend
    out = []
    for run in committed_runs(recipe=recipe_id):
        if not run.per_gpu_throughput or any(concerns(f, backend) for f in run.fixes_off):
            continue
        try:
            out.append((run, run_setup(run)))
        except RecipeError:
            continue
    return out


def rate_run(s: Setup, recipe_id: str) -> Any:
    """The committed run whose rate prices `s`: one that trained this very configuration (the same
    Setup, read back from its saved verl_config.yaml) on verl's code with every fix of the recipe
    on, the newest such. A run of another variant, batch or weight sync would price a job the user
    did not ask for: verl's own sync runs 2-3x slower than the recipe's. A rank rehearsal's rate is
    one rank's compute with no communication, never the job's: it prices nothing."""
    same = [
        (run.provenance.date_utc or "", run.run_dir.name, run)
        for run, rs in fixed_runs(recipe_id)
        if rs == s and run.provenance.rank_rehearsal is None
    ]
    return max(same, key=lambda t: t[:2])[2] if same else None


def capped_runs(s: Setup, recipe_id: str) -> list[Any]:
    """Committed runs of this configuration made under `train --cap-gib`: the same Setup but for
    vLLM's gpu_memory_utilization, which the cap rescales to a fraction of the larger GPU. They
    measure a card of the cap's size in memory only: their rate is the larger GPU's compute
    behind a smaller KV cache, a rate no card of that size has, so it prices nothing."""
    from dataclasses import replace

    util = s.rollout.gpu_memory_utilization
    out = [
        run
        for run, rs in fixed_runs(recipe_id)
        if run.provenance.cap_gib is not None
        and replace(rs, rollout=replace(rs.rollout, gpu_memory_utilization=util), notes=s.notes) == s
    ]
    return sorted(out, key=lambda r: r.run_dir.name)
