"""`verl-recipes peers table`: verl, TRL and OpenRLHF side by side on the workload, from their run folders.

Each run folder is read through what `verl-recipes report` wrote (summary.json) and its
provenance.json (whose `backend` names a peer; none is verl's recipe). The figures, all medians
of steps 2+ (`rundir.steady_steps`: step 1 carries compiles and warm-ups):
- step s: the step's wall time; tokens/s per GPU: the step's real tokens (prompts and answers,
  padding left out, as each side counts them) over its time and GPUs;
- to first step s: from the monitor's start to the first step's begin (start-up: imports, model
  loading, the rollout engine's start and CUDA graph capture);
- peak GiB per phase: NVML's device total (every process on the GPU), the highest over the steady
  steps, in the table's columns, each a phase of every side (COLUMNS): `gen` the rollout,
  `score` the rest of making the batch (log-probs of the old and the reference policy, rewards,
  advantages), `update` the optimizer's pass, `sync` the trained weights into the rollout engine;
  `step` is the whole step's peak.

The README tables are generated (`verl-recipes docs --write`) from
`recipes/7b-lora/comparisons/peers.yaml`, which names the committed run folder of each side and
row; a cell with no run says "not yet measured", never a number.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.peers import openrlhf, trl
from verl_recipes.rundir import read_provenance, read_summary, steady_steps
from verl_recipes.stack.pins import gpu_pins

#: the table's phase columns, and which phases of each side count toward each
COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    "gen": {"verl": ("gen",), "peer": ("gen",)},
    "score": {"verl": ("reward", "old_log_prob", "ref", "values", "adv"), "peer": ("score",)},
    "update": {"verl": ("update_actor", "update_critic"), "peer": ("update_actor",)},
    "sync": {"verl": ("update_weights",), "peer": ("update_weights",)},
}
INDEX = Path("recipes") / "7b-lora" / "comparisons" / "peers.yaml"


def side_label(peer: str) -> str:
    """Each side as the tables name it, with the version its environment pins (verl's from
    images/versions.toml, read when a table is made: an installed package has no checkout)."""
    return {"trl": f"TRL {trl.VERSION}", "openrlhf": f"OpenRLHF {openrlhf.VERSION}"}.get(peer) or (
        f"verl {gpu_pins()['verl']}"
    )


NOT_MEASURED = "not yet measured"


@dataclass(frozen=True)
class Figures:
    side: str  # verl, trl, openrlhf
    run: Path
    step_s: float | None
    tokens_s: float | None
    first_step_s: float | None
    peaks: dict[str, float | None]  # COLUMNS and "step"
    steps: int  # steps that ended
    status: str  # "finished", or how it ended


def _gpu_peak(peaks: dict[str, Any] | None) -> float | None:
    vals = [float(g["used_gib"]) for g in ((peaks or {}).get("gpu") or {}).values() if g.get("used_gib") is not None]
    return max(vals, default=None)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def figures(run: Path) -> Figures:
    """One run folder's row (module docstring)."""
    s: dict[str, Any] = dict(read_summary(run))
    prov = read_provenance(run)
    side = prov.backend or "verl"
    done = [st for st in s.get("steps", []) if st.get("time_s") is not None]
    steady: list[dict[str, Any]] = [dict(st) for st in steady_steps(done)] if done else []
    kind = "verl" if side == "verl" else "peer"
    peaks: dict[str, float | None] = {}
    for col, names in COLUMNS.items():
        vals = [p for st in steady for n in names[kind] if (p := _gpu_peak(st.get("phases", {}).get(n))) is not None]
        peaks[col] = max(vals, default=None)
    peaks["step"] = max((v for st in steady if (v := st.get("nvml_peak_gib")) is not None), default=None)
    ended: dict[str, Any] = dict(s.get("ended") or {})
    if ended.get("ok"):
        status = "finished"
    else:
        where = f"step {ended.get('step')}, {ended.get('phase')}" if ended.get("step") else "start-up"
        why = str(ended.get("last_error") or f"exit {ended.get('exit_code')}")
        status = f"stopped in {where}: {why[:160]}"
    if steady and all(int(st["step"]) < 2 for st in steady):
        status += " (step 1 only: warm-up included)"
    return Figures(
        side=side,
        run=run,
        step_s=_median([float(st["time_s"]) for st in steady]),
        tokens_s=_median([float(st["throughput"]) for st in steady if st.get("throughput")]),
        first_step_s=(s.get("startup") or {}).get("to_first_step_s"),
        peaks=peaks,
        steps=len(done),
        status=status,
    )


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


HEAD = (
    "| side | setting | step s | tokens/s per GPU | to first step s | peak GiB: gen | score | update | sync | "
    "step | run |"
)
RULE = "|---|---|---|---|---|---|---|---|---|---|---|"


def row(label: str, setting: str, f: Figures | None, link: str) -> str:
    if f is None:
        return f"| {label} | {setting} | {NOT_MEASURED} |  |  |  |  |  |  |  | |"
    p = f.peaks
    cells = [_f(f.step_s), _f(f.tokens_s, 0), _f(f.first_step_s, 1)]
    cells += [_f(p.get(c)) for c in (*COLUMNS, "step")]
    run = f"[{f.run.name}]({link})" + ("" if f.status == "finished" else f": {f.status}")
    return f"| {label} | {setting} | " + " | ".join(cells) + f" | {run} |"


def load_index(root: Path | None = None) -> dict[str, Any]:
    path = (root or repo_root()) / INDEX
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("batches"), dict):
        raise RecipeError(f"{path}: needs `batches:` (batch -> rows of side, setting, run)")
    return doc


def tables(prefix: str = "", root: Path | None = None) -> str:
    """The README tables, one per batch, from the committed runs peers.yaml names; `prefix` is the
    path from the README to recipes/7b-lora/ ('' in that folder, 'recipes/7b-lora/' at the root)."""
    root = root or repo_root()
    doc = load_index(root)
    out: list[str] = []
    for batch, spec in doc["batches"].items():
        out += [f"**{spec['title']}** ({batch}):", "", HEAD, RULE]
        for r in spec["rows"]:
            run = r.get("run")
            f = figures(root / INDEX.parent.parent / "results" / run) if run else None
            label = side_label(r["peer"])
            out.append(row(label, r["setting"], f, f"{prefix}results/{run}/report.md" if run else ""))
        out.append("")
    out.append(
        "Medians of steps 2+ on one GPU of the same host, one run at a time (`verl-recipes peers table`); "
        "peak GiB is NVML's device total in each phase; what each side and setting runs: "
        f"[{prefix}comparisons/peers.md]({prefix}comparisons/peers.md)."
    )
    return "\n".join(out)


def render(runs: list[Path]) -> str:
    """`peers table RUN...`: any run folders, side by side."""
    lines = [HEAD, RULE]
    for run in runs:
        f = figures(run)
        setting = (read_provenance(run).raw.get("peer") or {}).get("row") or "the recipe"
        lines.append(row(f.side, str(setting), f, str(run / "report.md")))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(render([Path(r) for r in args.runs]) if args.runs else tables())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("table", help="verl, TRL and OpenRLHF side by side, from run folders")
    p.add_argument("runs", nargs="*", help="run folders (default: the committed ones comparisons/peers.yaml names)")
    p.set_defaults(func=run)
