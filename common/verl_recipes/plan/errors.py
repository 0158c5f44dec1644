"""The planner's error against measured runs: `verl-recipes plan --errors` / `nox -s planner-errors`.

Every committed run `recipes/<id>/results/<run>/summary.json` (written by `verl_recipes.measure.report`,
schema verl-recipes/monitor-summary/1) is re-planned from the configuration it ran (the
`verl_config.yaml` the launcher saved beside it; the model's config.json as `model_config.json`
beside it when the model was not the recipe's full architecture, e.g. a truncated smoke model) on
the GPU it ran on (its total memory as NVML reported it), and every measured phase peak (the
report's per-phase NVML device peak over all steps; `outside` = loading and vLLM start-up, the
planner's name too) on every GPU is compared:

    error = (predicted - measured) / measured

A run is judged at the tokens it held: the trainer's micro-batches are sized at its longest logged
sequence (verl's `prompt_length/max` + `response_length/max`, `MeasuredRun.longest_sequence`)
instead of the configuration's bound, since verl pads a micro-batch only to its longest sequence.
A run that logged no step is judged at the bound.

`outside` is compared with the larger of the planner's `outside` and `update_weights`: time outside
every step includes verl's first weight sync to vLLM, before step 1 (with the KV cache resumed at
its end), so the measured `outside` peak is that sync whenever it is the larger.

Known causes of errors are kept with the data in `validation/planner-notes.yaml` (run, phase, why);
`--write FILE` writes the table with that column (validation/planner-errors.md is the committed one),
and first regenerates the host-RAM model's fitted bases from their runs (`host_fits`, the data
file `predict/host_fits.yaml`), judging the host rows with them, and the run-to-run spread per
engine from the committed reruns (`plan.spread`, the data file `predict/spread.yaml`).
A run fails the check when |error| exceeds the tolerance (10% by default) for any phase on any
GPU, explained or not. No runs at all is a failure too, unless `--allow-empty`: a planner nobody has checked must
not look checked. The mean residual per phase is printed as the data to refit the constants in
`phases.Constants` (per-process CUDA context, vLLM graphs, NCCL) from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from verl_recipes import GIB, RecipeError, inflight
from verl_recipes.paths import repo_root
from verl_recipes.plan.comm_fit import write_fit as write_comm_fit
from verl_recipes.plan.host_fits import write_fits
from verl_recipes.plan.host_runs import format_rows, host_rows
from verl_recipes.plan.host_runs import markdown as host_markdown
from verl_recipes.plan.runs import MeasuredRun, committed_runs, judged_setup, residual_line
from verl_recipes.plan.spread import write_spread
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.host import FITTED, load_fits
from verl_recipes.predict.phases import PHASES, Constants, plan_gpu


@dataclass(frozen=True)
class Row:
    run: str
    phase: str
    gpu: int
    measured: int
    predicted: int

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else float("inf")


def error_rows(root: Path | None = None, tolerance: float = 0.10, c: Constants | None = None) -> tuple[list[Row], bool]:
    """Predicted vs measured for every committed run: (rows, every |error| <= tolerance)."""
    base = root or repo_root()
    rows = [r for run in committed_runs(base) for r in run_error_rows(run, str(run.run_dir.relative_to(base)), c)]
    rows.sort(key=lambda r: (r.run, PHASES.index(r.phase), r.gpu))
    ok = bool(rows) and all(abs(r.error) <= tolerance for r in rows)
    return rows, ok


def run_error_rows(run: MeasuredRun, label: str, c: Constants | None = None) -> list[Row]:
    """Predicted vs measured for one run, every phase the planner models on every GPU, in the
    run's phase order; `label` names the run in each row. A rank rehearsal is planned as the rank
    it stood in for (`judged_setup`)."""
    if not run.phases:
        raise RecipeError(f"{run.path}: no per-phase GPU peaks (NVML); a CPU run cannot check the planner")
    setup = judged_setup(run)
    rows: list[Row] = []
    for idx, total in sorted(run.gpu_totals.items()):
        gpu = GPU(id=run.gpu_name or "measured", name=run.gpu_name, memory_bytes=total, visible_bytes=total)
        plan = plan_gpu(setup, gpu, c)
        for phase, per_gpu in run.phases.items():
            pp = plan.phase(phase)
            if pp is None or idx not in per_gpu:
                continue  # a phase the planner does not model (step, reward, adv, testing, ...)
            predicted = pp.total
            sync = plan.phase("update_weights")
            if phase == "outside" and sync is not None:  # `outside` includes verl's first sync
                predicted = max(predicted, sync.total)
            rows.append(Row(label, phase, idx, per_gpu[idx], predicted))
    return rows


def format_table(rows: list[Row], tolerance: float) -> str:
    out = [f"{'run':40s} {'phase':15s} {'gpu':>3s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"]
    for r in rows:
        flag = "" if abs(r.error) <= tolerance else "  FAIL"
        out.append(
            f"{r.run:40s} {r.phase:15s} {r.gpu:3d} {r.measured / GIB:9.2f} {r.predicted / GIB:9.2f} "
            f"{r.error:+7.1%}{flag}"
        )
    by_phase: dict[str, list[int]] = {}
    for r in rows:
        by_phase.setdefault(r.phase, []).append(r.measured - r.predicted)
    if by_phase:
        out.append(residual_line("phases.Constants", by_phase))
    return "\n".join(out)


def load_notes(root: Path) -> dict[tuple[str, str], str]:
    """(run folder, phase) -> why its error is what it is, from validation/planner-notes.yaml."""

    path = root / "validation" / "planner-notes.yaml"
    if not path.is_file():
        return {}
    raw = yaml.safe_load(path.read_text()) or []
    notes = {}
    for i, n in enumerate(raw):
        if not isinstance(n, dict) or not {"run", "phases", "why"} <= n.keys():
            raise RecipeError(f"{path}: entry {i}: needs run, phases and why")
        for ph in n["phases"]:
            notes[(str(n["run"]), str(ph))] = " ".join(str(n["why"]).split())
    return notes


def markdown_table(rows: list[Row], tolerance: float, notes: dict[tuple[str, str], str]) -> str:
    """The committed error table: every comparison, and why where an error is beyond tolerance."""
    out = [
        "| run | phase | GPU | measured GiB | predicted GiB | error | why (validation/planner-notes.yaml) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        why = notes.get((r.run, r.phase), "")
        if abs(r.error) > tolerance and not why:
            why = "**not explained yet**"
        out.append(
            f"| {r.run} | {r.phase} | {r.gpu} | {r.measured / GIB:.2f} | {r.predicted / GIB:.2f} | "
            f"{r.error:+.1%} | {why if abs(r.error) > tolerance else ''} |"
        )
    bad = [r for r in rows if abs(r.error) > tolerance]
    out.append("")
    out.append(f"{len(rows)} comparisons, {len(bad)} beyond ±{tolerance:.0%}.")
    return "\n".join(out) + "\n"


def main_errors(
    tolerance: float = 0.10, allow_empty: bool = False, root: Path | None = None, write: Path | None = None
) -> int:
    if not 0 < tolerance < 1:
        raise RecipeError(f"--tolerance {tolerance}: give a fraction such as 0.10")
    if write is not None:  # the FSDP communicator fit first: the device rows are planned with it
        inflight.check_folder(write, "the error table")
        comm_file = write_comm_fit(root or repo_root())
        print(f"wrote {comm_file}" if comm_file else "communicator fit: its runs are not in this checkout")
    rows, ok = error_rows(root, tolerance)
    if not rows:
        msg = "plan --errors: no measured runs found (recipes/*/results/*/summary.json); the planner is unchecked"
        print(msg + ("; passing because of --allow-empty" if allow_empty else ""))
        return 0 if allow_empty else 1
    print(format_table(rows, tolerance))
    base = root or repo_root()
    # --write regenerates the host fits from their runs first, and judges the host with them
    fits_file = write_fits(base) if write is not None else None
    hrows = host_rows(base, load_fits(fits_file) if fits_file else FITTED)
    if hrows:
        print(format_rows(hrows))
    if fits_file is not None:
        print(f"wrote {fits_file}")
    if write is not None:  # the run-to-run spread per engine, from the committed reruns
        print(f"wrote {write_spread(base)}")
    if write is not None:
        head = (
            "# The planner against every committed run\n\n"
            "Generated by `verl-recipes plan --errors --write validation/planner-errors.md` "
            "(error = (predicted - measured) / measured, per phase and GPU; the nox session "
            "`planner-errors` fails while any device error is beyond the tolerance).\n\n"
        )
        notes = load_notes(base)
        text = head + markdown_table(rows, tolerance, notes) + "\n" + host_markdown(hrows, tolerance, notes)
        inflight.write_text(write, text, "the error table")
        print(f"wrote {write}")
    bad = [r for r in rows if abs(r.error) > tolerance]
    print(f"{len(rows)} comparisons, {len(bad)} beyond ±{tolerance:.0%}: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1
