"""`verl-recipes vllm-pool`: what vLLM's worker's torch allocator does in a generation round, on
vLLM alone, round after round, the way verl cycles it (sleep -> wake -> generate).

Why: in verl's GSM8K quickstart as run on an H100 on 2026-12-07 (gpu/hosts/2026-12-07-h100x1-rank-
examples-2/, validation/planner-notes.yaml; 256 prompts a round, max_num_seqs 256, max_num_batched_tokens
8192, chunked prefill, Qwen2.5-0.5B's 151,936-token vocabulary) vLLM's process memory above its
awake level grows 1.7-6.5 GiB in the first second of every round, differently each round; vLLM's
"Sleep mode freed" lines put it in the torch caching allocator's pool of vLLM's worker, which each
sleep empties. vLLM's profile run leaves ~1.2 GiB for it, so the growth goes beyond
`gpu_memory_utilization` and the planner does not model it. This probe reads the pool itself.

What it runs: the engine verl 0.9.1's server starts for the composed config (rollout-bench's
`engine_args`: sleep mode on, the config's max_num_seqs, max_num_batched_tokens, utilization,
chunked prefill, CUDA graphs) as an `AsyncLLM`, with verl's worker extension plus a reader
(`vllm_pool_worker`). Each round: sleep at verl's level (2: weights discarded), wake the weights,
refill them (vLLM's dummy initialization stands in for verl's weight sync), wake the KV cache,
reset the prefix cache (as verl's `wake_up`), then the step's requests (rollout-bench's
`step_prompts` and `sampling`: the SamplingParams verl's server builds, logprobs 0 when verl asks
for log-probs). Every `--interval-ms` a `collective_rpc("pool_stats")` reads, between engine
steps, torch's allocated / reserved / active / inactive-split GiB, segments, the largest segment of
the default pool, alloc retries and cudaMallocs, beside NVML's used memory of the device.

Cases (`--cases`, each `--rounds` rounds on the one engine):
- `verl`: verl's settings, each request submitted on its own, arriving over `--arrival-s` (verl's
  agent loop workers send them one by one, not as one batch);
- `batched`: the same requests submitted at once;
- `nologprobs`: as `verl`, logprobs off;
- `greedy`: as `verl`, temperature 0 (verl's validation: val_kwargs temperature 0, do_sample off).
`PYTORCH_CUDA_ALLOC_CONF` is the process's, set before the engine starts (`--alloc-conf`; the
record says which); gpu/probes/vllm-pool.sh runs one engine per setting. vLLM 0.24 does not refuse
`expandable_segments:True` with sleep mode: `CuMemAllocator.use_memory_pool`
(vllm/device_allocator/cumem.py) turns it off while it allocates the weights and KV cache in its
pool and back on after, so the worker's own activations may use expandable segments.

What a result means for the planner (each round's `growth_gib` = peak reserved above the level
right after wake-up; torch's reserved counts vLLM's sleep-mode pool too, constant within a round,
and `default_pool_growth_gib` reads torch's default pool alone):
- growth the same in every case and round, and proportional to max_num_seqs x vocabulary (the
  sampler's fp32 logits, probabilities and logprobs of a full batch; gpu/probes/vllm-pool.sh runs
  an engine at half max_num_seqs beside it): a sampler term, modelled as such; `nologprobs` /
  `greedy` lower it by the logprobs' / sampling's share;
- growth only (or far more) with gradual arrival, varying round to round, in many segments of
  repeated sizes, `inactive_split_gib` high and reserved far above allocated: the allocator's
  fragmentation as the batch size changes step by step while requests arrive; bounded by an
  allocator setting (`max_split_size_mb`, `expandable_segments`; `garbage_collection_threshold`
  acts against `set_per_process_memory_fraction`, which vLLM's GPU worker never sets), whose
  record shows the bound; the planner then adds the bounded figure (or the recipe sets it);
- growth as large and as varied in `batched` as in `verl`: not the arrival but the mix of
  chunked-prefill and decode batch shapes of the first steps; the allocator settings still tell
  the bound;
- allocated itself peaking high (allocated's peak near reserved's): real tensors, not
  fragmentation; read `allocated_gib` at the peak against the batch's tokens.
- alloc_retries above 0: the allocator already freed cache and retried near the edge.

On a CPU host it refuses in one line (exit 2), as rollout-bench does; `--dry-run` prints the
engine arguments and each case's sampling settings without measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, cli_types, inflight
from verl_recipes.measure import rollout_bench as rb
from verl_recipes.measure.provenance import record
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.run_config import compose_run, default_data_dir, gpu_layout
from verl_recipes.recipe.verl_load import load_job
from verl_recipes.workload.synth import build_tokenizer, model_dir

#: the probe's cases: (arrival, logprobs off, greedy)
CASES: dict[str, tuple[str, bool, bool]] = {
    "verl": ("gradual", False, False),
    "batched": ("batched", False, False),
    "nologprobs": ("gradual", True, False),
    "greedy": ("gradual", False, True),
}
EXTENSION = "verl_recipes.measure.vllm_pool_worker.PoolStatsExtension"
NO_GPU = (
    "vllm-pool measures vLLM's worker's memory on a GPU, and this host has none that NVML sees (or no vLLM); "
    "run it on a GPU host, or pass --dry-run to print the engine arguments and each case's sampling"
)
GIB = 1024**3


def parse_cases(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if not names or bad:
        raise RecipeError(f"--cases {text}: name cases from {', '.join(CASES)}, comma-separated")
    if len(set(names)) != len(names):
        raise RecipeError(f"--cases {text}: a case named twice")
    return names


def case_sampling(case: str, params: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request's SamplingParams keywords in a case: verl's, with logprobs off or greedy."""
    _, no_logprobs, greedy = CASES[case]
    out = []
    for p in params:
        q = dict(p)
        if no_logprobs:
            q["logprobs"] = None
        if greedy:
            q.update(temperature=0.0, top_p=1.0, top_k=-1)
        out.append(q)
    return out


def arrival_offsets(n: int, arrival_s: float, case: str) -> list[float]:
    """When each request is submitted, seconds after the round starts: evenly over arrival_s for
    a gradual case, all at 0 for `batched`."""
    if CASES[case][0] == "batched" or n <= 1:
        return [0.0] * n
    return [arrival_s * i / (n - 1) for i in range(n)]


def round_summary(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One round's figures from its samples (`phase`: `awake`, the reading after wake-up and before
    the first request, then `gen`): the awake level, the peaks, the growth above the awake level,
    within the first second too, the steps by which reserved grew, and the allocator's counters."""
    awake = [s for s in samples if s["phase"] == "awake"]
    gen = [s for s in samples if s["phase"] == "gen"]
    if not awake or not gen:
        raise RecipeError("a round without its awake reading or without a reading during generation")
    base = awake[-1]
    t0 = gen[0]["t"]
    peak = max(gen, key=lambda s: s["reserved_gib"])
    first = [s for s in gen if s["t"] - t0 <= 1.0]
    steps: list[float] = []
    prev = base["reserved_gib"]
    for s in gen:
        if s["reserved_gib"] > prev + 1e-4:
            steps.append(round(s["reserved_gib"] - prev, 4))
        prev = s["reserved_gib"]
    nvml = [s["nvml_used_gib"] for s in gen if s.get("nvml_used_gib") is not None]
    return {
        "awake_reserved_gib": base["reserved_gib"],
        "awake_allocated_gib": base["allocated_gib"],
        "awake_nvml_used_gib": base.get("nvml_used_gib"),
        "peak_reserved_gib": peak["reserved_gib"],
        "peak_reserved_at_s": round(peak["t"] - t0, 3),
        "allocated_at_peak_gib": peak["allocated_gib"],
        "peak_allocated_gib": max(s["allocated_gib"] for s in gen),
        "peak_inactive_split_gib": max(s["inactive_split_gib"] for s in gen),
        "growth_gib": round(peak["reserved_gib"] - base["reserved_gib"], 4),
        "growth_first_s_gib": round(max(s["reserved_gib"] for s in first) - base["reserved_gib"], 4),
        # torch's default pool alone (vLLM's sleep-mode pool apart), which each sleep empties
        "default_pool_growth_gib": round(max(s["default_pool_gib"] for s in gen) - base["default_pool_gib"], 4),
        "default_pool_allocated_at_peak_gib": peak["default_pool_allocated_gib"],
        "growth_steps_gib": steps,
        "peak_nvml_used_gib": max(nvml) if nvml else None,
        "nvml_growth_gib": round(max(nvml) - base["nvml_used_gib"], 4)
        if nvml and base.get("nvml_used_gib") is not None
        else None,
        "max_segments": max(s["segments"] for s in gen),
        "max_default_pool_segments": max(s["default_pool_segments"] for s in gen),
        "largest_segment_gib": max(s["largest_segment_gib"] for s in gen),
        "alloc_retries": gen[-1]["alloc_retries"] - base["alloc_retries"],
        "device_allocs": gen[-1]["device_allocs"] - base["device_allocs"],
        "ooms": gen[-1]["ooms"] - base["ooms"],
        "samples": len(gen),
        "seconds": round(gen[-1]["t"] - t0, 3),
    }


class Recorder:
    """The samples of a run, each tagged with its case, round and phase, and each round's summary."""

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.rounds: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def add(
        self, case: str, rnd: int, phase: str, stats: dict[str, Any], nvml_used_gib: float | None, **extra: Any
    ) -> None:
        self.samples.append(
            {
                "t": round(time.monotonic() - self.t0, 4),
                "case": case,
                "round": rnd,
                "phase": phase,
                "nvml_used_gib": nvml_used_gib,
                **stats,
                **extra,
            }
        )

    def close_round(self, case: str, rnd: int, **extra: Any) -> dict[str, Any]:
        mine = [s for s in self.samples if s["case"] == case and s["round"] == rnd]
        summary = {"case": case, "round": rnd, **round_summary(mine), **extra}
        self.rounds.append(summary)
        return summary

    def record(self, head: dict[str, Any]) -> dict[str, Any]:
        return {**head, "rounds": self.rounds, "samples": self.samples}


def summary_line(s: dict[str, Any]) -> str:
    return (
        f"{s['case']} round {s['round']}: awake {s['awake_reserved_gib']:.2f} GiB reserved, growth "
        f"{s['growth_gib']:+.2f} (first s {s['growth_first_s_gib']:+.2f}) in {len(s['growth_steps_gib'])} steps, "
        f"allocated at peak {s['allocated_at_peak_gib']:.2f}, segments {s['max_segments']}, largest "
        f"{s['largest_segment_gib']:.2f}, retries {s['alloc_retries']}, NVML peak {s['peak_nvml_used_gib']}"
    )


def write_record(out: Path, rec: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    inflight.write_text(out, json.dumps(rec, indent=1, default=str) + "\n", "the vllm-pool record")


def _nvml_reader() -> Any:
    """A function returning NVML's used GiB of the engine's device (CUDA_VISIBLE_DEVICES' first)."""
    import pynvml

    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
    return lambda: round(pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB, 4)


async def _request(llm: Any, prompt: Any, params: Any, request_id: str, delay: float, state: dict[str, int]) -> None:
    """One request as verl's server sends it: on its own, once its arrival time has come."""
    await asyncio.sleep(delay)
    state["submitted"] += 1
    final = None
    async for out in llm.generate(prompt, params, request_id):
        final = out
    state["finished"] += 1
    state["tokens"] += len(final.outputs[0].token_ids) if final else 0


async def _round(
    llm: Any,
    sample: Any,
    case: str,
    rnd: int,
    prompts: list[Any],
    sp: list[Any],
    offsets: list[float],
    interval_s: float,
    sleep_level: int,
    rec: Recorder,
) -> dict[str, Any]:
    """verl's cycle: sleep, wake the weights, refill them (verl syncs the actor's), wake the KV
    cache, reset the prefix cache; then the requests, read every interval until the last ends."""
    await llm.sleep(level=sleep_level)
    await sample(case, rnd, "asleep")
    await llm.wake_up(tags=["weights"])
    if sleep_level == 2:
        await llm.collective_rpc("pool_refill_weights")
    await llm.wake_up(tags=["kv_cache"])
    await llm.reset_prefix_cache()
    await sample(case, rnd, "awake")
    state = {"submitted": 0, "finished": 0, "tokens": 0}
    start = time.monotonic()
    tasks = [
        asyncio.create_task(_request(llm, prompts[i], sp[i], f"{case}-{rnd}-{i}", offsets[i], state))
        for i in range(len(prompts))
    ]
    while not all(t.done() for t in tasks):
        await sample(case, rnd, "gen", submitted=state["submitted"], finished=state["finished"])
        await asyncio.sleep(interval_s)
    for t in tasks:
        t.result()  # a request that failed fails the run, saying where
    await sample(case, rnd, "gen", submitted=state["submitted"], finished=state["finished"])
    return rec.close_round(case, rnd, generated_tokens=state["tokens"], wall_s=round(time.monotonic() - start, 3))


async def _measure(
    engine: dict[str, Any],
    model: Path,
    prompts: list[list[int]],
    params: list[dict[str, Any]],
    cases: list[str],
    rounds: int,
    arrival_s: float,
    interval_s: float,
    sleep_level: int,
    rec: Recorder,
) -> None:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    nvml = _nvml_reader()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(model), **{**engine, "worker_extension_cls": EXTENSION}))

    async def sample(case: str, rnd: int, phase: str, **extra: Any) -> None:
        stats = (await llm.collective_rpc("pool_stats"))[0]
        rec.add(case, rnd, phase, stats, nvml(), **extra)

    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    try:
        for case in cases:
            sp = [SamplingParams(**p) for p in case_sampling(case, params)]
            offsets = arrival_offsets(len(prompts), arrival_s, case)
            for rnd in range(1, rounds + 1):
                s = await _round(llm, sample, case, rnd, requests, sp, offsets, interval_s, sleep_level, rec)
                print(summary_line(s), flush=True)
        await llm.sleep(level=sleep_level)
        await sample("end", 0, "asleep")
    finally:
        llm.shutdown()


def compose(args: argparse.Namespace) -> tuple[Any, Any, Any, Path]:
    """The recipe (or verl job), its composed config, the model's HF config and the model's path,
    as `train` composes them (rollout-bench's derivation, a verl example's too)."""

    vjob = load_job(None, [], None, args.verl_example, args.sets, None) if args.verl_example else None
    recipe: Recipe
    if vjob is not None:
        if args.recipe:
            raise RecipeError("give a recipe id or --verl-example NAME, not both")
        recipe, sets, layout = vjob.recipe, list(vjob.sets), vjob.layout
    elif args.recipe:
        recipe = get_recipe(args.recipe)
        sets, layout = list(args.sets), gpu_layout(recipe)
    else:
        raise RecipeError("give a recipe id or --verl-example NAME")
    model = model_dir(recipe.model.arch, None, "full-width")
    cfg = compose_run(recipe, [], sets, layout, model=model, data=default_data_dir())
    return recipe, cfg, rb.model_hf_config(recipe), model


def run(args: argparse.Namespace) -> int:
    cases = parse_cases(args.cases)
    if args.rounds < 1:
        raise RecipeError("--rounds must be at least 1")
    if args.out and args.out.exists():
        raise RecipeError(f"--out {args.out} exists; name a new file")
    gpu = rb.vllm_available()
    if not gpu and not args.dry_run:  # before anything loads: one line
        raise RecipeError(NO_GPU)
    if args.alloc_conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf  # the engine's processes inherit it
    recipe, cfg, hf, model = compose(args)
    engine = rb.engine_args(cfg, hf)
    if not engine["enable_sleep_mode"]:
        raise RecipeError("the config runs vLLM without sleep mode; the probe reads rounds between sleeps")
    rc = rb.rollout_config(cfg)
    gpu = gpu and not args.dry_run
    if gpu:
        rb.ensure_model(recipe.model.arch)

    rb.ensure_data(default_data_dir())
    if gpu:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    else:
        tokenizer = build_tokenizer(hf)
    prompts = rb.step_prompts(cfg, tokenizer, getattr(hf, "model_type", None))
    params = rb.sampling(cfg, prompts, engine["max_model_len"])
    alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    print(f"vllm-pool {recipe.id}: model {model}; PYTORCH_CUDA_ALLOC_CONF={alloc!r}")
    print("engine arguments (AsyncLLM): " + json.dumps(engine, sort_keys=True, default=str))
    for case in cases:
        print(f"case {case} ({CASES[case][0]}): " + json.dumps(rb.summary(case_sampling(case, params)), sort_keys=True))
    per = f"{len(prompts) // int(rc.n)} prompts x n={rc.n}"
    print(f"prompts: {len(prompts)} requests ({per}); {args.rounds} rounds a case")
    if not gpu:
        print(rb.NEEDS_GPU)
        return 0
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path("runs") / f"vllm-pool-{recipe.id}-{stamp}.json"
    rec = Recorder()
    head = {
        "provenance": record([sys.executable, "-m", "verl_recipes.cli", *sys.argv[1:]], {"recipe": recipe.id}),
        "recipe": recipe.id,
        "sets": list(args.sets),
        "model": str(model),
        "engine_args": engine,
        "pytorch_cuda_alloc_conf": alloc,
        "cases": {c: rb.summary(case_sampling(c, params)) | {"arrival": CASES[c][0]} for c in cases},
        "rounds_per_case": args.rounds,
        "arrival_s": args.arrival_s,
        "interval_ms": args.interval_ms,
        "sleep_level": args.sleep_level,
        "prompt_tokens": [len(p) for p in prompts],
    }
    # a campaign's time limit ends the probe with SIGTERM: the rounds read so far are still written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        asyncio.run(
            _measure(
                engine,
                model,
                prompts,
                params,
                cases,
                args.rounds,
                args.arrival_s,
                args.interval_ms / 1000,
                args.sleep_level,
                rec,
            )
        )
    finally:  # what was measured is kept, a failed run said in it
        failed = sys.exc_info()[1]
        if failed is not None:
            head["failed"] = f"{type(failed).__name__}: {failed}"
        write_record(out, rec.record(head))
        print(f"vllm-pool record: {out}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("vllm-pool", help="vLLM's worker's torch allocator, round by round, on vLLM alone")
    p.add_argument("recipe", nargs="?", help="a recipe id (or --verl-example NAME)")
    p.add_argument("--verl-example", help="a verl example of validation/verl-examples/suite.yaml")
    cli_types.add_set_option(p)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)} (default all)")
    p.add_argument("--rounds", type=int, default=3, help="sleep -> wake -> generate rounds a case (default 3)")
    p.add_argument("--arrival-s", type=float, default=1.0, help="seconds over which a gradual case's requests arrive")
    p.add_argument("--interval-ms", type=float, default=50.0, help="milliseconds between readings (default 50)")
    p.add_argument("--sleep-level", type=int, choices=(1, 2), default=2, help="vLLM sleep level (verl's: 2)")
    p.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF for the engine (default: the environment's)")
    p.add_argument("--out", type=Path, help="the JSON record (default runs/vllm-pool-RECIPE-TIME.json)")
    p.add_argument("--dry-run", action="store_true", help="print the engine arguments and cases, measure nothing")
    p.set_defaults(func=run)
