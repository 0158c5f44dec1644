"""`verl-recipes peers run PEER`: one peer's run of the workload, under our monitor, into a run folder.

In our environment: the checkpoint and the dataset the recipe trains on (made once, shared with
verl's run of the same campaign), the peer's command line composed from the workload
(`peers.trl`, `peers.openrlhf`) or given whole (`--args-from`, recipe verl-vs-deepspeed's
`compare.py openrlhf-args`), peer.json for the launcher. Then `verl-recipes monitor` runs the
launcher in the peer's own environment: a fresh Python whose path is this checkout's `common/`
and the peer's installed wheelhouse (`--site`, `gpu/offline-host.sh install` with SITE set), not
ours. Afterwards provenance.json (the peer's packages, from the launcher's environment.json), the
exit code and `verl-recipes report`'s summary, which the comparison (`peers table`) reads. A run
that fails is reported too: where a peer cannot run, its folder is the evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, has_gpu, inflight
from verl_recipes.measure.provenance import record
from verl_recipes.measure.report import write_report
from verl_recipes.measure.rollout_bench import ensure_model
from verl_recipes.paths import cache_dir, repo_root
from verl_recipes.peers import openrlhf, trl
from verl_recipes.peers.spec import ENVIRONMENT, KEY_PACKAGES, Spec
from verl_recipes.peers.workload import BATCHES, RECIPE, ROWS, VERL_VARIANTS, Paths, workload
from verl_recipes.recipe.run_config import default_data_dir
from verl_recipes.rundir import EXIT_CODE, LOG, write_provenance
from verl_recipes.workload import dataset
from verl_recipes.workload.synth import model_dir

PEERS = {"trl": trl, "openrlhf": openrlhf}
#: where `gpu/offline-host.sh install` puts a peer's wheelhouse when SITE=/tmp/site-<peer>
SITE_ENV = "VERL_RECIPES_PEER_SITE"
COMMAND = "command.sh"


def default_site(peer: str) -> Path:
    return Path(os.environ.get(SITE_ENV) or f"/tmp/site-{peer}")


def check_site(peer: str, site: Path) -> None:
    """The peer's installed wheelhouse: its package must be there, or the run would import ours."""
    if not any(site.glob(f"{peer}-*.dist-info")):
        raise RecipeError(
            f"--site {site}: no {peer} installed there; carry and install the peer's wheelhouse first "
            f"(SITE={site} STAGE=/tmp/wh-stage-{peer} gpu/offline-host.sh gather ... && ... install; gpu/README.md)"
        )


def composed(peer: str, batch: str, row: str, paths: Paths, args_from: Path | None) -> tuple[list[str], dict[str, Any]]:
    """The peer's command line and what names the run in provenance.json."""
    if args_from is not None:
        try:
            given = json.loads(args_from.read_text())
        except (OSError, ValueError) as e:
            raise RecipeError(f"--args-from {args_from}: not a JSON file of the command line ({e})") from None
        if not isinstance(given, dict) or not isinstance(given.get("argv"), list):
            raise RecipeError(f"--args-from {args_from}: needs {{'argv': [...], 'names': {{...}}}}")
        return [str(a) for a in given["argv"]], dict(given.get("names") or {})
    w = workload(batch)
    module = PEERS[peer]
    if peer == "openrlhf":
        argv = openrlhf.argv(w, row, paths, str(Path(__file__).with_name("rewards.py")))
    else:
        argv = module.argv(w, row, paths)
    names = {"recipe": RECIPE, "adv_estimator": "grpo", "variants": list(VERL_VARIANTS), "steps": w.batch.steps}
    return argv, names


def child_env(peer: str, site: Path) -> dict[str, str]:
    """What the peer's Python gets on top of the monitor's environment: this checkout's package and
    the peer's wheelhouse, then the host's own packages; none of ours (their versions differ:
    images/peers/<peer>.toml). Hugging Face stays offline and its caches out of the run folder."""
    return {
        "PYTHONPATH": f"{repo_root() / 'common'}:{site}",
        "PATH": f"{site / 'bin'}:{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(cache_dir() / "peers" / peer / "hf"),
        "WANDB_MODE": "disabled",
    }


def _ensure_data() -> Path:
    out = default_data_dir()
    if not dataset.complete(out):
        dataset.write(out, 4096, 256)
    return out / "train.parquet"


def provenance(run_dir: Path, peer: str, spec: Spec, names: dict[str, Any], command: list[str]) -> Path:
    """provenance.json: the record every run has, with the peer's own packages (environment.json)
    in place of ours, and the fields that name the run (`recipe.run_names`)."""
    env: dict[str, Any] = {}
    if (run_dir / ENVIRONMENT).is_file():
        env = json.loads((run_dir / ENVIRONMENT).read_text())
    rec = record(command, root=repo_root())
    rec["packages"] = env.get("packages") or dict.fromkeys(KEY_PACKAGES)
    rec.update(
        {
            "recipe": names.get("recipe", RECIPE),
            "backend": peer,
            "world": spec.gpus,
            "rank_rehearsal": None,
            "adv_estimator": names.get("adv_estimator", "grpo"),
            "variants": list(names.get("variants", [])),
            "sets": [],
            "steps": names.get("steps"),
            "model": spec.model,
            "data": spec.parquet,
            "peer": {
                "name": peer,
                "row": spec.row,
                "batch": spec.batch,
                "pins": f"images/peers/{peer}.toml",
                "argv": spec.argv,
                "python": env.get("python"),
            },
        }
    )
    return write_provenance(run_dir, rec)


def run(args: argparse.Namespace) -> int:
    peer = args.peer
    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RecipeError(f"--run-dir {run_dir} is not empty; give a new folder (a run folder is never rewritten)")
    if args.row not in (openrlhf.ROWS if peer == "openrlhf" else ROWS):
        raise RecipeError(f"{peer} has no row {args.row!r}")
    if peer == "trl" and args.gpus != 1:
        raise RecipeError("TRL runs here on one GPU (its colocated vLLM); more GPUs need `accelerate launch`")
    site = Path(args.site) if args.site else default_site(peer)
    model = Path(args.model) if args.model else None
    parquet = Path(args.data) if args.data else None
    if not args.dry_run:
        if not has_gpu():
            raise RecipeError("peers run needs an NVIDIA GPU; --dry-run composes and prints the command here")
        check_site(peer, site)
        model = model or ensure_model(workload(args.batch).arch)
        parquet = parquet or _ensure_data()
    model = model or model_dir(workload(args.batch).arch, None, "full-width")
    parquet = parquet or default_data_dir() / "train.parquet"
    paths = Paths(model=str(model), data=str(run_dir / "data"), out=str(run_dir / f"{peer}-output"))
    if peer == "openrlhf":
        paths = Paths(paths.model, str(run_dir / "data" / "train.jsonl"), paths.out)
    argv, names = composed(peer, args.batch, args.row, paths, Path(args.args_from) if args.args_from else None)
    batch = "given" if args.args_from else args.batch  # a command line given whole is no batch of ours
    spec = Spec(peer, args.row, batch, argv, str(model), str(parquet), str(run_dir / "data"), args.gpus)
    launcher = [sys.executable, "-m", f"verl_recipes.peers.run_{peer}", str(run_dir)]
    monitor = [sys.executable, "-m", "verl_recipes.cli", "monitor", "--out", str(run_dir), "--"]
    # the monitor runs in our environment; `env` gives the launcher the peer's, and sh its log
    peer_env = [f"{k}={v}" for k, v in child_env(peer, site).items()]
    command = [*monitor, "env", *peer_env, "sh", "-c", 'exec "$@" >"$0" 2>&1', str(run_dir / LOG), *launcher]
    if args.dry_run:
        print(json.dumps({"spec": spec.__dict__, "command": command}, indent=1))
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    spec.write(run_dir)
    inflight.write_text(run_dir / COMMAND, f"#!/bin/sh\n{shlex.join(command)}\n", "the command")
    print(f"+ {peer} ({args.row}, {args.batch}) in {run_dir}: {shlex.join(argv)}", flush=True)
    rc = subprocess.run(command).returncode
    inflight.write_text(run_dir / EXIT_CODE, f"{rc}\n", "the exit code")
    provenance(run_dir, peer, spec, names, command)
    write_report(run_dir)
    print(f"{peer}: exit {rc}; {run_dir / 'report.md'}", flush=True)
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run a peer (TRL, OpenRLHF) on the workload under the monitor")
    p.add_argument("peer", choices=sorted(PEERS))
    p.add_argument("--run-dir", required=True, help="the run folder (new)")
    p.add_argument("--batch", choices=sorted(BATCHES), default="8x8", help="the workload's batch (default 8x8)")
    p.add_argument("--row", default="docs", help="docs (the peer's documentation), tuned, full (OpenRLHF only)")
    p.add_argument("--site", help=f"the peer's installed wheelhouse (default ${SITE_ENV} or /tmp/site-PEER)")
    p.add_argument("--model", help="the checkpoint (default: the synthetic one verl's run of the recipe uses)")
    p.add_argument("--data", help="the prompts' train.parquet (default: the embedded dataset)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the peer runs on (default 1)")
    p.add_argument("--args-from", help="a JSON file {'argv': [...], 'names': {...}}: the peer's command line as given")
    p.add_argument("--dry-run", action="store_true", help="compose and print the command; run nothing")
    p.set_defaults(func=run)
