"""The recipe's throughput at the batch people train with, beside NeMo RL's published figures.

NeMo RL reports a GRPO run as model, GPUs, the batch, the average sequence length, tokens/s per
GPU and step time; the README tables (`verl-recipes docs --write`) put this recipe's runs in the
same columns under the published rows, from `recipes/7b-lora/comparisons/throughput.yaml`, which
names each source and each committed run folder. A run's figures are medians of steps 2+ (step 1
carries compiles and warm-ups): verl's `perf/throughput` (prompt + answer tokens of the step over
its time and GPUs), `timing_s/step`, `response_length/mean`; the batch from its composed config.
A row with no run says "not yet measured", never a number.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.rundir import METRICS, STEADY_FROM, read_jsonl, read_provenance

INDEX = Path("recipes") / "7b-lora" / "comparisons" / "throughput.yaml"
NOT_MEASURED = "not yet measured"
HEAD = "| model | system | GPUs | prompts x answers | average length | tokens/s per GPU | step s | source |"
RULE = "|---|---|---|---|---|---|---|---|"


def run_row(run: Path) -> dict[str, Any]:
    """One run folder's cells (module docstring)."""
    rows, _ = read_jsonl(run / METRICS)
    steady = [r.get("metrics", {}) for r in rows if isinstance(r.get("step"), int) and r["step"] >= STEADY_FROM]
    if not steady:
        raise RecipeError(f"{run}: no step after the first; the table takes medians of steps 2+")

    def med(key: str) -> float | None:
        xs = [float(m[key]) for m in steady if m.get(key) is not None]
        return statistics.median(xs) if xs else None

    cfg = yaml.safe_load((run / "verl_config.yaml").read_text())
    prov = read_provenance(run)
    names = prov.gpu_names
    prompts, answers = int(cfg["data"]["train_batch_size"]), int(cfg["actor_rollout_ref"]["rollout"]["n"])
    return {
        "gpus": f"{len(names)} x {names[0].removeprefix('NVIDIA ')}" if names else "-",
        "batch": f"{prompts} x {answers} = {prompts * answers} answers",
        "avg_len": med("response_length/mean"),
        "tokens_per_s_per_gpu": med("perf/throughput"),
        "step_s": med("timing_s/step"),
    }


def _n(v: float | None, nd: int = 0) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def table(prefix: str = "", root: Path | None = None) -> str:
    """The README table; `prefix` is the path from the README to recipes/7b-lora/."""
    root = root or repo_root()
    doc = yaml.safe_load((root / INDEX).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("published"), list) or not isinstance(doc.get("runs"), list):
        raise RecipeError(f"{root / INDEX}: needs `published:` and `runs:` lists")
    lines = [HEAD, RULE]
    for p in doc["published"]:
        cells = [p["model"], p["system"], p["gpus"], p["batch"], str(p["avg_len"])]
        cells += [_n(float(p["tokens_per_s_per_gpu"])), _n(float(p["step_s"]), 1), f"[published]({p['source']})"]
        lines.append("| " + " | ".join(cells) + " |")
    for r in doc["runs"]:
        label = f"Llama-2-7B widths, LoRA r64, {r['setting']}"
        if not r.get("run"):
            lines.append(f"| {label} | verl-recipes 7b-lora | {NOT_MEASURED} |  |  |  |  | |")
            continue
        f = run_row(root / INDEX.parent.parent / "results" / r["run"])
        cells = [label, "verl-recipes 7b-lora", f["gpus"], f["batch"], _n(f["avg_len"]) + " (answers)"]
        cells += [
            _n(f["tokens_per_s_per_gpu"]),
            _n(f["step_s"], 1),
            f"[{r['run']}]({prefix}results/{r['run']}/report.md)",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "LoRA against full fine-tunes: the recipe trains 0.16B adapter weights of a random 6.7B model; NeMo RL "
        "trains all 8B weights of a trained one, on math answers. Medians of steps 2+; sources and "
        f"definitions in [{prefix}comparisons/throughput.yaml]({prefix}comparisons/throughput.yaml).",
    ]
    return "\n".join(lines)
