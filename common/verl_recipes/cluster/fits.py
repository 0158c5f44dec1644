"""The pre-submit check's memory question: does the job fit the allocation's GPUs?

The layout rules (`settings.check_train_layout`) say whether verl starts the job on the
allocation; only the planner says whether it fits in the GPUs' memory, and a 13B job on one
80 GB GPU otherwise passes the check and fails minutes later, after Ray and the model load. So the
check asks the planner, with the same functions `plan` and `train`'s preview use
(`plan.advice`): the job of TRAIN_CMD (its variants and --set lines) on the allocation's layout,
judged on the allocation's GPU. That GPU is the one named (`--gpu`, or GPU=), else what NVML
calls the GPU of the node the check runs on (the allocation's first node); with neither (a dry
run off the cluster) the check's line says the plan was not judged, and `train`'s pre-flight on
the head judges it.

Standard library at import, as the rest of the wing (a host Python may run the check): the
planner loads inside `check_fits`, and its ImportError is the check's note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_recipes import GIB, RecipeError

if TYPE_CHECKING:
    from verl_recipes.predict.gpus import GPU


def allocation_gpu(named: str | None) -> tuple[GPU | None, str]:
    """The GPU the job is judged on and where that came from; (None, ...) when none is known."""
    from verl_recipes.predict.gpus import catalogued, parse_gpu

    if named:
        return parse_gpu(named), f"--gpu {named}"
    from verl_recipes.measure.provenance import gpus

    devs = gpus().get("gpus") or []
    if not devs:
        return None, "no GPU named (--gpu / GPU=) and none seen by NVML here"
    d = min(devs, key=lambda x: x["memory_total_bytes"])
    gpu = catalogued(d["name"]) or parse_gpu(f"{d['memory_total_bytes'] / GIB:.2f}GiB")
    return gpu, f"NVML: {d['name']}"


def check_fits(recipe_id: str, variants: list[str], sets: list[str], nodes: int, gpus: int, named: str | None) -> str:
    """Refuse, in one line naming the variant (or the knobs) that fits, a job the planner predicts
    does not fit the allocation's GPU; returns the planner's verdict for the check's line."""
    from verl_recipes.plan.advice import _gib, calibrated, fitting_variants, verdict, whole_fix
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch
    from verl_recipes.predict.phases import plan_gpu
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import Composition, Layout, compose_run

    gpu, source = allocation_gpu(named)
    if gpu is None:  # a dry run off the cluster: nothing to judge against; `train` judges on the head
        return f"plan: not judged ({source}; GPU=ID or --gpu ID names it)"
    recipe = get_recipe(recipe_id)
    cfg = compose_run(recipe, variants, sets, Layout(gpus, nodes))
    s = setup_from_config(cfg, Arch.from_config(recipe.arch_config, f"{recipe.model.arch}/config.json"))
    job = " --variant ".join([recipe_id, *variants]) + f" on {nodes} x {gpus} GPU(s)"
    p = plan_gpu(s, gpu)
    cal = calibrated(recipe, variants, s, gpu)
    peak = cal.peak_bytes if cal else p.peak.total
    if verdict(p, cal):
        return f"plan: fits {gpu.id} ({source}), peak {_gib(peak)} of {_gib(gpu.visible_bytes)} GiB"
    head = (
        f"the planner predicts {job} does not fit {gpu.id} ({source}): peak {_gib(peak)} of "
        f"{_gib(gpu.visible_bytes)} GiB"
    )
    fits = fitting_variants(recipe, Composition(tuple(variants), tuple(sets), gpus if nodes == 1 else None), gpu)
    if fits:
        f = fits[0]
        raise RecipeError(f"{head}; {f.flags} does (peak {_gib(f.peak_bytes)} GiB): add it to TRAIN_CMD")
    raise RecipeError(f"{head}; {whole_fix(s, gpu)}")
