"""The host-RAM model's fitted bases, regenerated from the committed runs each fit lists.

`predict/host_fits.yaml` holds one fit per configuration of a run's processes (`ray-local-start`
on or off, vLLM's executor, the first runs' records): which runs it is fitted to (curated, as a
bounds file's source runs are) and its base at three moments. The model (`predict.host`) reads
the file and never a run; this module writes it, from the runs, when `verl-recipes plan --errors
--write FILE` regenerates the error table, so the fits move with the runs as the bounds do.

The base of a moment is what the run's processes held beyond the model's terms: the measured
host memory minus `plan_host`'s terms for that run (its configuration, the fixes it ran without).
Per run, the measured figure at each moment is

    load        the largest read before vLLM's first process appears (samples.jsonl.gz; the whole
                run when it never does: it stopped while the trainer loaded)
    first sync  the largest read from vLLM's start to step 1's begin (runs that began step 1)
    train       the largest read in a step's phases other than the sync (summary.json's phases)

and over the fit's runs the base is the median of the RSS figures (read at 2 Hz) and the largest
of the PSS figures (read 10 s to minutes apart, each a lower bound of the PSS at that moment),
each at 0.1 GiB.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError, inflight
from verl_recipes.plan.host_runs import measured
from verl_recipes.plan.runs import MeasuredRun, read_run, results_dir, run_setup
from verl_recipes.predict.host import FIT_MOMENTS, FITS_FILE, FITS_SCHEMA, HostConstants, fit_from_doc, plan_host
from verl_recipes.rundir import PHASES, SAMPLES, read_jsonl

#: where the data file sits in a checkout (the package's own copy is `host.FITS_FILE`)
FITS_PATH = Path("common/verl_recipes/predict/host_fits.yaml")

HEADER = """\
# The host-RAM model's fitted bases (verl_recipes/predict/host.py, HostConstants), one per
# configuration of a run's processes. Generated: `verl-recipes plan --errors --write
# validation/planner-errors.md` regenerates every base_gib from the runs its fit lists
# (verl_recipes/plan/host_fits.py says how); edit a fit's runs or note, never its numbers.
"""

#: the class of a vLLM process in the monitor's samples (`measure.monitor`'s process classes)
VLLM_CLASS = "vllm_engine"


@dataclass(frozen=True)
class Reads:
    """The largest RSS and PSS read in one window of a run; PSS None where none was read."""

    rss: int
    pss: int | None


def _largest(samples: list[dict[str, Any]]) -> Reads | None:
    rss = [int(h["rss"]) for h in samples if h.get("rss")]
    pss = [int(h["pss"]) for h in samples if h.get("pss")]
    return Reads(max(rss), max(pss) if pss else None) if rss else None


def _step_one_begins(run_dir: Path) -> float | None:
    """When step 1 began (the phase markers), None for a run that never began a step."""
    records, _ = read_jsonl(run_dir / PHASES)
    return next((float(r["t"]) for r in records if r.get("event") == "begin" and r.get("name") == "step"), None)


def start_reads(run_dir: Path) -> dict[str, Reads]:
    """moment -> the largest reads of the run's host memory before step 1: `load` (before vLLM's
    first process) and `first sync` (from it to step 1's begin, for a run that began step 1)."""
    samples, _ = read_jsonl(run_dir / SAMPLES)
    t1 = _step_one_begins(run_dir)
    load: list[dict[str, Any]] = []
    sync: list[dict[str, Any]] = []
    for rec in samples:
        host = rec.get("host")
        if rec.get("kind") != "sample" or not host:
            continue
        if t1 is not None and float(rec["t"]) >= t1:
            break
        (sync if sync or VLLM_CLASS in (host.get("by_class") or {}) else load).append(host)
    out = {"load": _largest(load)}
    if t1 is not None:
        out["first sync"] = _largest(sync)
    return {k: v for k, v in out.items() if v is not None}


def run_bases(run: MeasuredRun, fit: HostConstants) -> dict[str, tuple[int, int | None]]:
    """moment -> (RSS, PSS or None) the run's processes held beyond the model's terms."""
    s = run_setup(run)
    prov = run.provenance
    ranks = 1 if prov.rank_rehearsal else None
    hp = plan_host(s, run.fixes_off, fit, ranks_here=ranks, pools_shared=prov.rank_pools_shared)
    reads = {m: (r.rss, r.pss) for m, r in start_reads(run.run_dir).items()}
    if "train" in (got := measured(run)):
        reads["train"] = got["train"]
    out: dict[str, tuple[int, int | None]] = {}
    for moment, (rss, pss) in reads.items():
        m = hp.moment(moment)
        stem = FIT_MOMENTS[moment]
        terms_rss = m.rss - getattr(fit, f"{stem}_rss")
        terms_pss = m.pss - getattr(fit, f"{stem}_pss")
        out[moment] = (rss - terms_rss, None if pss is None else pss - terms_pss)
    return out


def _gib(b: float) -> float:
    return round(b / GIB, 1)


def fitted_base(root: Path, doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A fit's `base_gib`, from the runs it lists (module docstring)."""
    fit = fit_from_doc(doc)
    results = results_dir(root / "recipes" / str(doc["recipe"]))
    per: dict[str, tuple[list[int], list[int]]] = {m: ([], []) for m in FIT_MOMENTS}
    for name in fit.fitted_from:
        if not (results / name).is_dir():
            raise RecipeError(f"host fit {doc['name']}: no committed run {results / name}")
        for moment, (rss, pss) in run_bases(read_run(results / name), fit).items():
            per[moment][0].append(rss)
            if pss is not None:
                per[moment][1].append(pss)
    out = {}
    for moment, (rss_all, pss_all) in per.items():
        if not rss_all or not pss_all:
            raise RecipeError(f"host fit {doc['name']}: none of its runs read the host at {moment}")
        out[moment] = {"rss": _gib(statistics.median(rss_all)), "pss": _gib(max(pss_all))}
    return out


def regenerate(root: Path, path: Path | None = None) -> str:
    """The data file at `path` (the checkout's, else the package's) with every base refitted."""
    src = path or (root / FITS_PATH if (root / FITS_PATH).is_file() else FITS_FILE)
    doc = yaml.safe_load(src.read_text())
    if not isinstance(doc, dict) or doc.get("schema") != FITS_SCHEMA:
        raise RecipeError(f"{src}: not a {FITS_SCHEMA} file")
    fits = [{**f, "base_gib": fitted_base(root, f)} for f in doc["fits"]]
    body = yaml.safe_dump({"schema": FITS_SCHEMA, "fits": fits}, sort_keys=False, width=100)
    return HEADER + body


def write_fits(root: Path) -> Path | None:
    """Regenerate the checkout's data file in place; None where `root` holds none (a checkout
    without the package's sources)."""
    path = root / FITS_PATH
    if not path.is_file():
        return None
    inflight.write_text(path, regenerate(root, path), "the host fits")
    return path
