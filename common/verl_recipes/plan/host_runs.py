"""The host-RAM model (`predict/host.py`) against every committed run's measured host memory.

Each run's summary.json (the report's `peak.host` and per-phase `host`: the sum over the run's
processes of RSS, read at 2 Hz, and of PSS, read every 10 s in the first runs and once a minute or
less since) is compared moment by
moment with the prediction for the configuration it ran (its verl_config.yaml) and the weight sync
it ran: the fixes it ran without, from its provenance.json (`fixes.recorded_off`: a run
recorded before `verl_fixes_off` existed ran verl's merged sync with its CPU copy). The base is the
fit of the run's own configuration (`host.host_fit`): `ray-local-start` on where its record lists
the fix as applied, vLLM's executor from its verl_config.yaml; a record without `verl_fixes_off`
is one of the first runs, predicted from their fit (`host.FIRST_RUNS_FIT`). The fits are data
(`predict/host_fits.yaml`), regenerated from their runs by `host_fits`.

    outside         the report's time outside every step (loading, vLLM start, the first sync,
                    and the run's end after its last step) vs the largest of `load`, `first
                    sync` and `train` (`load` alone for a run that never reached step 1, with
                    `first sync` for one that reached verl's "trainer ready", the sync's start)
    train           the largest of a step's phases other than the sync vs `train`
    update_weights  the sync inside a step vs `update_weights`
    peak            the run's peak vs the largest moment it reached (the figure `verify` uses)

A PSS read 10 s or more apart can miss a peak that lasts seconds, so a measured PSS is a lower
bound of the run's PSS at that moment; RSS is read often enough to catch it. These rows are
reported beside the device rows, not gated by `planner-errors`: the model is new and the PSS
readings are sparse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import GIB
from verl_recipes.fixes import RAY_START_FIX, recorded_on
from verl_recipes.measure.startup import TRAINER_READY
from verl_recipes.plan.runs import MeasuredRun, committed_runs, residual_line, run_setup
from verl_recipes.predict.host import FIRST_RUNS, FITTED, HostConstants, HostPlan, host_fit, plan_host
from verl_recipes.predict.inputs import Setup

ROWS = ("outside", "train", "update_weights", "peak")
_NOT_TRAIN = {"outside", "update_weights"}


@dataclass(frozen=True)
class HostRow:
    run: str
    moment: str
    cpu_backup_sync: bool
    measured_rss: int
    predicted_rss: int
    measured_pss: int | None
    predicted_pss: int

    @property
    def rss_error(self) -> float:
        return (self.predicted_rss - self.measured_rss) / self.measured_rss

    @property
    def pss_error(self) -> float | None:
        if not self.measured_pss:
            return None
        return (self.predicted_pss - self.measured_pss) / self.measured_pss


def _b(gib: object) -> int | None:
    return round(float(gib) * GIB) if isinstance(gib, int | float) else None


def measured(run: MeasuredRun) -> dict[str, tuple[int, int | None]]:
    """moment -> (RSS, PSS or None) measured, for the moments the run has."""
    s = run.raw
    out: dict[str, tuple[int, int | None]] = {}
    phases = s.get("phases") or {}
    for name in ("outside", "update_weights"):
        host = (phases.get(name) or {}).get("host") or {}
        rss = _b(host.get("rss_gib"))
        if rss:
            out[name] = (rss, _b(host.get("pss_gib")))
    train = [(p.get("host") or {}) for n, p in phases.items() if n not in _NOT_TRAIN]
    rss_all = [b for h in train if (b := _b(h.get("rss_gib")))]
    pss_all = [b for h in train if (b := _b(h.get("pss_gib")))]
    if rss_all:
        out["train"] = (max(rss_all), max(pss_all) if pss_all else None)
    peak = (s.get("peak") or {}).get("host") or {}
    rss = _b(peak.get("rss_gib"))
    if rss:
        out["peak"] = (rss, _b(peak.get("pss_gib")))
    return out


def run_fit(run: MeasuredRun, s: Setup, fits: Mapping[str, HostConstants] = FITTED) -> HostConstants:
    """The fit of the base for the configuration a committed run recorded, of `fits` (the data
    file's, `host.load_fits`)."""
    prov = run.provenance
    if prov.verl_fixes_off is None:
        return fits[FIRST_RUNS]
    return host_fit(recorded_on(prov, RAY_START_FIX), s.rollout.executor == "uni", fits)


def predicted(hp: HostPlan, stepped: bool, synced: bool = False) -> dict[str, tuple[int, int]]:
    """moment -> (RSS, PSS) predicted, as the rows compare them. `synced`: a run without a step
    that began verl's first weight sync (it died in it)."""
    load = hp.moment("load")
    before = [load, hp.moment("first sync")] if synced else [load]
    reached = before if not stepped else hp.moments
    outside = before if not stepped else [load, hp.moment("first sync"), hp.moment("train")]
    out = {
        "outside": (max(m.rss for m in outside), max(m.pss for m in outside)),
        "train": (hp.moment("train").rss, hp.moment("train").pss),
        "update_weights": (hp.moment("update_weights").rss, hp.moment("update_weights").pss),
        "peak": (max(m.rss for m in reached), max(m.pss for m in reached)),
    }
    return out


def host_rows(root: Path, fits: Mapping[str, HostConstants] = FITTED) -> list[HostRow]:
    """Measured vs predicted host RAM for every committed run that recorded it, each predicted from
    its configuration's fit of `fits`."""
    return [r for run in committed_runs(root) for r in run_host_rows(run, str(run.run_dir.relative_to(root)), fits)]


def run_host_rows(run: MeasuredRun, label: str, fits: Mapping[str, HostConstants] = FITTED) -> list[HostRow]:
    """Measured vs predicted host RAM of one run, moment by moment (`ROWS`), none where it recorded
    none. A rank rehearsal is held to its rank's share of the node: `plan_host` with one rank's
    processes, and its share of the CPU worker pools where it ran only its share."""
    got = measured(run)
    if not got:
        return []
    s = run_setup(run)
    prov = run.provenance
    ranks = 1 if prov.rank_rehearsal else None
    hp = plan_host(s, run.fixes_off, run_fit(run, s, fits), ranks_here=ranks, pools_shared=prov.rank_pools_shared)
    stages = [st.get("stage") for st in (run.raw.get("startup") or {}).get("stages") or []]
    want = predicted(hp, stepped=bool(run.raw.get("steps")), synced=TRAINER_READY in stages)
    rows = []
    for moment in ROWS:
        if moment not in got:
            continue
        (m_rss, m_pss), (p_rss, p_pss) = got[moment], want[moment]
        rows.append(HostRow(label, moment, hp.cpu_backup_sync, m_rss, p_rss, m_pss, p_pss))
    return rows


def _e(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def format_rows(rows: list[HostRow]) -> str:
    """The console table, and the mean residual per moment to refit the fits (`HostConstants`) from."""
    cols = f"{'RSS meas':>8s} {'pred':>6s} {'err':>7s} {'PSS meas':>8s} {'pred':>6s} {'err':>7s}"
    out = [f"{'run':48s} {'moment':15s} {cols}"]
    for r in rows:
        pss = f"{r.measured_pss / GIB:8.2f}" if r.measured_pss else f"{'-':>8s}"
        out.append(
            f"{r.run:48s} {r.moment:15s} {r.measured_rss / GIB:8.2f} {r.predicted_rss / GIB:6.2f} "
            f"{_e(r.rss_error):>7s} {pss} {r.predicted_pss / GIB:6.2f} {_e(r.pss_error):>7s}"
        )
    res: dict[str, list[int]] = {}
    for r in rows:
        res.setdefault(r.moment, []).append(r.measured_rss - r.predicted_rss)
    if res:
        out.append("host RSS: " + residual_line("host.HostConstants", res))
    return "\n".join(out)


def markdown(rows: list[HostRow], tolerance: float, notes: dict[tuple[str, str], str]) -> str:
    """The host section of validation/planner-errors.md; notes are keyed (run, 'host MOMENT')."""
    out = [
        "## Host RAM",
        "",
        "The host-RAM model (`verl_recipes/predict/host.py`: PREDICTED figures) against each run's measured "
        "host memory (`verl_recipes/plan/host_runs.py` says what each moment compares). PSS is read 10 s to "
        "minutes apart (RSS at 2 Hz), so a measured PSS is a lower bound of the run's PSS at that moment. "
        "Reported, not gated.",
        "",
        "| run | moment | CPU-backup sync | measured RSS GiB | predicted RSS GiB | error | measured PSS GiB "
        "| predicted PSS GiB | error | why (validation/planner-notes.yaml) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        worst = max(abs(r.rss_error), abs(r.pss_error or 0.0))
        why = notes.get((r.run, f"host {r.moment}"), "")
        if worst > tolerance and not why:
            why = "**not explained yet**"
        pss = f"{r.measured_pss / GIB:.2f}" if r.measured_pss else "not read"
        out.append(
            f"| {r.run} | {r.moment} | {'yes' if r.cpu_backup_sync else 'no'} | {r.measured_rss / GIB:.2f} | "
            f"{r.predicted_rss / GIB:.2f} | {_e(r.rss_error)} | {pss} | {r.predicted_pss / GIB:.2f} | "
            f"{_e(r.pss_error)} | {why if worst > tolerance else ''} |"
        )
    bad = [r for r in rows if max(abs(r.rss_error), abs(r.pss_error or 0.0)) > tolerance]
    out += ["", f"{len(rows)} host comparisons, {len(bad)} beyond ±{tolerance:.0%}."]
    return "\n".join(out) + "\n"
