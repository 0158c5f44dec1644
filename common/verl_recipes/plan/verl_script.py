"""`plan` of a verl job as its users write it: the composed configuration, and what the header says.

The job (`recipe.verl_job`) is composed exactly as `train` composes it (`run_config.compose_run`
on the job's deltas-free recipe, its `--set` lines and its layout), so the plan judges the job a
rehearsal runs. The header says what was mapped (the model id, the data, the reward, the loggers,
the layout) and, by name, each key the job sets that the planner does not model
(`predict.verl_keys.not_modelled`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from verl_recipes import GIB, RecipeError
from verl_recipes.layout import RankSpec
from verl_recipes.paths import repo_root
from verl_recipes.plan.advice import verdict_margin
from verl_recipes.plan.errors import run_error_rows
from verl_recipes.plan.host_runs import run_host_rows
from verl_recipes.plan.runs import VERL_EXAMPLES, read_run, results_dir
from verl_recipes.predict.gpus import parse_gpu
from verl_recipes.predict.host import plan_host
from verl_recipes.predict.inputs import Setup, setup_from_config
from verl_recipes.predict.margin import load_spread
from verl_recipes.predict.model import Arch
from verl_recipes.predict.phases import PHASES, Constants, plan_gpu
from verl_recipes.predict.verl_keys import not_modelled
from verl_recipes.recipe.run_config import compose_run
from verl_recipes.recipe.verl_job import VerlJob, verl_job
from verl_recipes.recipe.verl_suite import load_suite
from verl_recipes.rundir import measured_runs as found
from verl_recipes.rundir import read_provenance
from verl_recipes.workload.arch import arch_config_path

#: the folder of an entry's failed runs, beside its run folders (recipes' results/failed/)
FAILED = "failed"


def compose_job(job: VerlJob, layers: int | None = None, fixes_off: Sequence[str] = ()) -> tuple[Any, Setup]:
    """(composed config, Setup) of the job, as `train` composes it."""

    try:
        cfg = compose_run(job.recipe, [], list(job.sets), job.layout)
    except RecipeError as e:
        raise RecipeError(f"{job.source}: {e}") from None
    path = arch_config_path(job.arch)

    arch = Arch.from_config(json.loads(path.read_text()), f"{job.arch}/config.json")
    if layers is not None:
        arch = replace(arch, layers=layers)
    return cfg, setup_from_config(cfg, arch, fixes_off)


def header(job: VerlJob) -> list[str]:
    """The lines above the plan: where the job came from, what was mapped, what is not modelled."""
    lines = [f"verl job: {job.source} ({len(job.keys)} keys set)"]
    lines += [f"mapped: {m}" for m in job.mapped]
    missing = not_modelled(job.keys, job.dropped)
    lines.append(f"not modelled: {', '.join(missing)}" if missing else "not modelled: none of the keys it sets")
    return lines


#: the GPUs the suite's table is planned on: the cards verl's examples are written for
TABLE_GPUS = ("a100-80g", "h100-80g", "h200-141g")
TABLE = "table.md"


def _gib(b: float) -> str:

    return f"{b / GIB:.1f}"


@dataclass(frozen=True)
class Row:
    """One suite entry as the table shows it: planned, refused with its line, or out."""

    name: str
    link: str
    world: str  # "nodes x GPUs"
    why: str | None = None  # the line an entry that is out or does not plan gives
    out: bool = False
    phases: tuple[str, ...] = ()
    # (GPU id, GiB per phase, the verdict in `predict.margin`'s words: fits, tight, does not fit)
    per_gpu: tuple[tuple[str, tuple[float, ...], str], ...] = ()
    host_gib: float = 0.0
    not_modelled: tuple[str, ...] = ()
    measured: tuple[Measured, ...] = ()  # the entry's committed runs
    # an entry out as written (a script on sglang), planned through the `--set` lines every one of
    # its runs was made with: what was measured is the script so changed, and the plan is of that
    planned_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Measured:
    """A committed run of one suite entry (`train --verl-example NAME`, in
    validation/verl-examples/results/NAME/<run name>, the name `train` gives it): what the table
    puts beside the prediction."""

    name: str  # the run folder's path under results/: <entry>/<run name>
    gpu: str  # NVML's name of its GPU
    peak_gib: float  # its device peak over every phase and GPU
    phase: str  # the phase of that peak
    date: str  # the day it ran (provenance)
    rank: RankSpec | None  # a rank rehearsal's rank and world
    # the planner's error, (predicted - measured) / measured, per phase on the run's first GPU, as
    # validation/planner-errors.md gives it (`errors.run_error_rows`: a rank planned as that rank)
    errors: tuple[tuple[str, float], ...] = ()
    host_pss_gib: float | None = None  # its host PSS peak (summary.json's peak.host.pss_gib)
    # the PSS peak predicted for what it ran (`host_runs.run_host_rows`, moment `peak`): the node's
    # for a whole job, one rank's share of the node for a rank rehearsal
    host_predicted_gib: float | None = None
    # the `--set` lines `train --verl-example` ran it with beyond the script's own (a micro-batch
    # the card holds, vLLM for a script's sglang rollout): the run is of the script so changed
    user_sets: tuple[str, ...] = ()

    def words(self, base: str) -> str:
        """`base` is the link's path to the results folder from the file the words go into."""
        rank = f", rank rehearsal ({self.rank.rank} of {self.rank.world})" if self.rank else ""
        sets = f", with {' '.join(f'`--set {s}`' for s in self.user_sets)}" if self.user_sets else ""
        errors = ", ".join(f"{ph} {e:+.1%}" for ph, e in self.errors)
        per_phase = f"; planner's error per phase: {errors}" if errors else ""
        return (
            f"measured{rank}{sets}: [{self.name}]({base}/{self.name}/report.md), {self.peak_gib:.2f} GiB "
            f"({self.phase}) on one {self.gpu}, {self.date}{per_phase}"
        )

    def host_words(self) -> str:
        """The measured host PSS peak beside the prediction it is held to, or "" without one."""
        if self.host_pss_gib is None or self.host_predicted_gib is None:
            return ""
        err = (self.host_predicted_gib - self.host_pss_gib) / self.host_pss_gib
        held = (
            f"rank {self.rank.rank} of {self.rank.world}'s share of the node {self.host_predicted_gib:.2f} predicted"
            if self.rank
            else f"{self.host_predicted_gib:.2f} predicted"
        )
        return f"{self.name}: PSS peak {self.host_pss_gib:.2f} measured, {held} ({err:+.1%})"


def measured_runs() -> dict[str, tuple[Measured, ...]]:
    """The committed runs of the suite's entries, by entry (the recipe their provenance names); a
    run that failed (results/NAME/failed/<run name>, as a recipe's results/failed/) is left out:
    its peak is where it stopped, not the entry's."""
    out: dict[str, list[Measured]] = {}
    root = repo_root()
    base = results_dir(root / VERL_EXAMPLES)
    for d in found(base):
        if FAILED in d.relative_to(base).parts:  # evidence of a failure, not the entry's measurement
            continue
        prov = read_provenance(d)
        run = read_run(d)
        phase, per = max(run.phases.items(), key=lambda kv: max(kv[1].values()))
        gib = max(per.values()) / GIB
        day = (prov.date_utc or "")[:10]
        label = str(d.relative_to(root))
        first = min(run.gpu_totals, default=0)
        errors = tuple(
            (r.phase, r.error)
            for r in sorted(run_error_rows(run, label), key=lambda r: PHASES.index(r.phase))
            if r.gpu == first
        )
        peak = next((r for r in run_host_rows(run, label) if r.moment == "peak"), None)
        pss = peak.measured_pss / GIB if peak and peak.measured_pss else None
        host = peak.predicted_pss / GIB if peak else None
        m = Measured(
            str(d.relative_to(base)),
            run.gpu_name,
            gib,
            phase,
            day,
            prov.rank_rehearsal,
            errors,
            pss,
            host,
            prov.user_sets,
        )
        out.setdefault(prov.recipe or "", []).append(m)
    return {k: tuple(v) for k, v in out.items()}


def suite_plans() -> list[Row]:
    """Every suite entry planned on TABLE_GPUS at its own GPU count (or its one line)."""

    gpus = [parse_gpu(g) for g in TABLE_GPUS]
    c = Constants()
    spread = load_spread()
    ran = measured_runs()
    rows = []
    for name, e in load_suite().items():
        link = f"[{name}](https://github.com/volcengine/verl/blob/{e.commit[:9]}/{e.path})"
        runs = ran.get(name, ())
        sets = _common_sets(runs) if e.out else ()
        if e.out and not sets:
            rows.append(Row(name, link, _world(e), e.out, out=True, measured=runs))
            continue
        try:  # an entry out as written plans with the --set its runs ran with (vLLM for sglang)
            job = verl_job(e.command(), name, sets)
            _, s = compose_job(job)
        except RecipeError as err:
            rows.append(Row(name, link, _world(e), e.out or str(err), out=bool(e.out), measured=runs))
            continue
        plans = [plan_gpu(s, g, c) for g in gpus]
        rows.append(
            Row(
                name,
                link,
                f"{s.nnodes}x{s.gpus_per_node}",
                phases=tuple(ph.phase for ph in plans[0].phases),
                per_gpu=tuple(
                    (
                        p.gpu.id,
                        tuple(round(ph.total / GIB, 1) for ph in p.phases),
                        verdict_margin(s, p, None, c, spread).word,
                    )
                    for p in plans
                ),
                host_gib=round(plan_host(s, []).peak.pss / GIB, 1),
                not_modelled=tuple(not_modelled(job.keys, job.dropped)),
                measured=runs,
                planned_with=sets,
            )
        )
    return rows


def _common_sets(runs: Sequence[Measured]) -> tuple[str, ...]:
    """The `--set` lines every run of an entry was made with, in the first run's order."""
    if not runs:
        return ()
    return tuple(v for v in runs[0].user_sets if all(v in m.user_sets for m in runs[1:]))


def _as_run(r: Row) -> str:
    """The words after an entry planned through its runs' `--set` lines."""
    return f" (as run: {' '.join(f'`--set {v}`' for v in r.planned_with)})" if r.planned_with else ""


def _full_row(r: Row) -> str:
    if r.out:
        if not r.measured:
            return f"| {r.link} | out | {_cell(r.why or '')} | | | |"
        host = "<br>".join(w for m in r.measured if (w := m.host_words()))
        return f"| {r.link} | out | {_cell(r.why or '')} | {host} | {_behind(r, 'results')} | |"
    if r.why:
        return f"| {r.link} | {r.world} | does not plan: {_cell(r.why)} | | | |"
    cells = "<br>".join(f"{gid}: {' / '.join(f'{v:.1f}' for v in vals)} ({word})" for gid, vals, word in r.per_gpu)
    return (
        f"| {r.link}{_as_run(r)} | {r.world} | {'/'.join(r.phases)}: {cells} | {_host(r, '')} "
        f"| {_behind(r, 'results')} | {', '.join(r.not_modelled) or '-'} |"
    )


def _host(r: Row, unit: str) -> str:
    """The host RAM cell: the node's predicted PSS peak, then each committed run's measured PSS
    peak beside the prediction for what it ran (a rank rehearsal: its rank's share of the node)."""
    runs = [w for m in r.measured if (w := m.host_words())]
    return "<br>".join([f"{r.host_gib:.1f}{unit}" + (" predicted" if runs else ""), *runs])


def _behind(r: Row, base: str) -> str:
    """The "behind it" cell: the entry's committed runs, each with its measured peak, else the
    word prediction."""
    return "<br>".join(m.words(base) for m in r.measured) or "prediction"


def summary(rows: list[Row]) -> str:
    """The README's table: the entries that plan, their peak per GPU on each card."""
    head = "| verl example | GPUs | " + " | ".join(TABLE_GPUS) + " | host RAM per node | behind it |"
    lines = [head, "|---|---|" + "---|" * len(TABLE_GPUS) + "---|---|"]
    for r in rows:
        if r.out or r.why:
            continue
        peaks = " | ".join(f"{max(vals):.1f} GiB ({word})" for _, vals, word in r.per_gpu)
        behind = _behind(r, "validation/verl-examples/results")
        lines.append(f"| {r.link}{_as_run(r)} | {r.world} | {peaks} | {_host(r, ' GiB')} | {behind} |")
    refused = [r for r in rows if r.why and not r.out]
    out = [r for r in rows if r.out]
    lines += [
        "",
        f"{len(refused)} more {'entry' if len(refused) == 1 else 'entries'} of the suite "
        f"{'does' if len(refused) == 1 else 'do'} not plan under verl 0.9.1 and {len(out)} are out of it "
        "(Megatron, multimodal, mixture-of-experts, Ascend NPU, another rollout engine, a construct not read "
        "statically), each with its one line in [the full table](validation/verl-examples/table.md).",
    ]
    return "\n".join(lines) + "\n"


def _world(e: Any) -> str:
    keys = {o.key: o.text.split("=", 1)[1] for o in e.overrides}
    return f"{keys.get('trainer.nnodes', '1')}x{keys.get('trainer.n_gpus_per_node', '8')}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def suite_table(rows: list[Row] | None = None) -> str:
    """validation/verl-examples/table.md, whole (`plan --verl-examples --write` writes it)."""
    head = [
        "# verl's example scripts, planned",
        "",
        "Generated by `verl-recipes plan --verl-examples --write validation/verl-examples/table.md` from",
        "`suite.yaml` (verl's scripts read at the commit each row links); do not edit by hand.",
        "Per-GPU peaks are GiB (1024^3) per phase, in the order named, PREDICTED by the planner on each",
        "job's own GPU count, each GPU's verdict in `plan`'s words (fits; tight: under the card by less",
        "than the margin that moves the peak, `predict/margin.py`; does not fit); host RAM is the",
        'predicted PSS peak of one node. "behind it" names each',
        "entry's runs committed in `results/` (`verl-recipes train --verl-example NAME`), with the",
        "device peak measured over every phase beside the prediction and the planner's error per phase",
        "((predicted - measured) / measured, as `validation/planner-errors.md` gives it, a rank rehearsal",
        "planned as its rank); an entry without one is a prediction only, and one out as written whose",
        "runs answered why with a `--set` (vLLM for a script's sglang) is planned as they ran it (as run:",
        "its runs' common `--set` lines). Under the host RAM, each run's",
        "measured host PSS peak beside the PSS peak predicted for what it ran: the node's, or for a rank",
        "rehearsal its rank's share of the node (one rank's processes and its share of the job's CPU",
        "worker pools, `predict/host.py`'s `plan_host`).",
        "",
        "| example | nodes x GPUs | predicted peak per GPU, GiB, per phase | host RAM per node, GiB "
        "| behind it | keys not modelled |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join([*head, *(_full_row(r) for r in rows or suite_plans())]) + "\n"


README_BEGIN, README_END = "<!-- verl-examples:begin -->", "<!-- verl-examples:end -->"


def with_summary(readme: str, rows: list[Row]) -> str:
    """README.md's text with its verl-examples block replaced by `summary(rows)`."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise RecipeError(f"README.md has no {README_BEGIN} ... {README_END} block")
    return readme[: start + len(README_BEGIN)] + "\n" + summary(rows) + readme[end:]
