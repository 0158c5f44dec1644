"""`verl-recipes rollout-bench`: vLLM alone on exactly the rollout work of one step of a recipe.

What it measures: the seconds of one `vllm.LLM.generate` call on the prompts the first training
step of the recipe sends, with the engine arguments and sampling settings verl 0.9.1's rollout
server derives from the same composed config (`engine_args`, `sampling`), on the same synthetic
model `train` makes. It is the denominator of "verl's gen / vLLM alone": `timing_s/gen` of a
`train` run's steps 2+ against this command's median, both on one host.

How the work is made the same:
- the config is composed as `train` composes it (`recipe.run_config.compose_run`, the recipe's
  layout, its variants and `--set`s), and read through verl's own `RolloutConfig` dataclass;
- the engine arguments follow `vLLMHttpServer.launch_server` (the `args` dict it builds, its
  `compilation_config` default, `engine_kwargs.vllm`, the LoRA and expert-parallel additions) and
  `_validate_configs` (max_model_len from the model, max_num_batched_tokens raised without chunked
  prefill); a CPU test reads the keys of verl's dict from its source, so a key verl adds fails it;
- the prompts are the first `data.train_batch_size` rows verl's own sampler and `RLHFDataset` give
  step 1, each repeated `rollout.n` times in turn (the trainer's `repeat(interleave=True)`), turned
  into token ids by verl's Continuous Token builder (the chat template) and capped at
  `rollout.prompt_length` as the agent loop does; one request per sample, as verl sends them;
- the sampling settings follow the agent loop and `vLLMHttpServer.generate`: temperature, top_p,
  top_k, repetition_penalty 1.0, logprobs 0 when verl asks for log-probs, ignore_eos, max_tokens
  = min(response_length, prompt_length + response_length - prompt tokens) within max_model_len.

What it leaves out, and so what the ratio prices: verl's agent loop and its workers, the HTTP
round trips to the server, the server's async engine (vLLM's offline `LLM` runs the same engine
core in this process), the weight sync and the sleep / wake-up around generation, the trainer
waiting on Ray. The weights are vLLM's dummy ones (`load_format: dummy`, as verl starts the engine)
and not the synced actor's, so a sample may stop at its EOS at another point than in a run: the
record carries the tokens generated, and the per-step decode time divides by the longest sample.
The timed calls send the warm-up's prompts again, so vLLM's prefix cache (on, as verl runs it)
serves their prefill, which a training step computes: prompts of tens of tokens against hundreds
generated keep that a small part of a call.

On a CPU host (no vLLM) the command prints what it would run and exits 0, as `train` rehearses.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, cli_types, inflight
from verl_recipes.measure.provenance import gpus, record
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.run_config import compose_run, default_data_dir, gpu_layout
from verl_recipes.workload.arch import resolve_arch
from verl_recipes.workload.synth import build_tokenizer, hf_config, model_dir, shape_config

#: verl's vLLM rollout server, relative to the verl package: where the engine arguments are built
SERVER_SOURCE = "workers/rollout/vllm_rollout/vllm_async_server.py"

#: keys of verl's server `args` this benchmark does not pass to `vllm.LLM`, and why
LEFT_OUT: dict[str, str] = {}

#: the one line a CPU host ends with
NEEDS_GPU = "the measurement needs a GPU host with vLLM; on this host: the engine arguments and sampling settings above"
NO_GPU = (
    "rollout-bench measures vLLM on a GPU, and this host has none that NVML sees (or no vLLM); run it on a "
    "GPU host, or pass --dry-run to print the engine arguments and sampling settings it would use"
)


def rollout_config(cfg: Any) -> Any:
    """verl's `RolloutConfig` of the composed config: the object its rollout server reads."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)


def model_hf_config(recipe: Recipe) -> Any:
    """The HF config of the synthetic full-width checkpoint of the recipe's architecture (what
    `synth-model` writes): its max_position_embeddings and model_type are what verl reads."""

    return hf_config(shape_config(resolve_arch(recipe.model.arch), None, "full-width"))


def max_model_len(rc: Any, hf: Any) -> int:
    """`_validate_configs`: rollout.max_model_len, else the model's max_position_embeddings (the
    text config's for a multimodal model, as verl's `get_max_position_embeddings` reads it; that
    module imports verl's HTTP server stack, which a CPU host need not have)."""
    limit = getattr(hf, "max_position_embeddings", None)
    if limit is None:
        limit = getattr(getattr(hf, "text_config", None), "max_position_embeddings", None)
    if limit is None:
        raise RecipeError(
            "the model's config has no max_position_embeddings; set actor_rollout_ref.rollout.max_model_len"
        )
    if rc.max_model_len is None:
        return int(limit)
    if int(rc.max_model_len) > int(limit):
        raise RecipeError(
            f"actor_rollout_ref.rollout.max_model_len {rc.max_model_len} is above the model's "
            f"max_position_embeddings {limit}; lower it"
        )
    return int(rc.max_model_len)


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain dicts and lists (what vLLM's config classes and JSON take)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def engine_args(cfg: Any, hf: Any) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` that verl 0.9.1's `vLLMHttpServer.launch_server` passes
    to `vllm serve` for replica 0 of this config (values as `vllm.LLM` takes them: dicts where
    verl writes JSON strings for the command line). One engine on this host's GPUs only: a data-
    parallel rollout, several nodes or a quantized rollout is refused in one line."""
    rc = rollout_config(cfg)
    model = cfg.actor_rollout_ref.model
    if int(rc.data_parallel_size) > 1 or int(cfg.trainer.nnodes) > 1:
        raise RecipeError(
            "rollout-bench measures one vLLM engine on one node; set actor_rollout_ref.rollout.data_parallel_size=1 "
            "and use a recipe layout of one node"
        )
    if rc.quantization is not None or (rc.qat and rc.qat.enable):
        raise RecipeError("rollout-bench measures an unquantized rollout; drop rollout.quantization and rollout.qat")
    if rc.mtp is not None and rc.mtp.enable and rc.mtp.enable_rollout:
        raise RecipeError(
            "rollout-bench does not derive MTP speculative decoding; set rollout.mtp.enable_rollout=false"
        )

    engine_kwargs = _plain(dict((rc.engine_kwargs or {}).get("vllm", {}) or {}))
    engine_kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
    compilation = engine_kwargs.pop("compilation_config", None) or {}
    if isinstance(compilation, str):
        compilation = json.loads(compilation)
    compilation = dict(compilation)
    compilation.setdefault("cudagraph_mode", "FULL_AND_PIECEWISE")
    if (engine_kwargs.get("decode_context_parallel_size", 1) or 1) > 1 and compilation[
        "cudagraph_mode"
    ] == "FULL_AND_PIECEWISE":
        compilation["cudagraph_mode"] = "PIECEWISE"
    if rc.cudagraph_capture_sizes:
        compilation["cudagraph_capture_sizes"] = list(rc.cudagraph_capture_sizes)

    length = max_model_len(rc, hf)
    batched = int(rc.max_num_batched_tokens)
    if not rc.enable_chunked_prefill and batched < length:
        batched = length  # verl raises it, with a warning
    args: dict[str, Any] = {
        "dtype": rc.dtype,
        "load_format": rc.load_format,
        "skip_tokenizer_init": False,
        "distributed_executor_backend": "mp",
        "worker_extension_cls": "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
        "trust_remote_code": bool(model.get("trust_remote_code", False)),
        "max_model_len": length,
        "max_num_seqs": int(rc.max_num_seqs),
        "enable_chunked_prefill": bool(rc.enable_chunked_prefill),
        "max_num_batched_tokens": batched,
        "enable_prefix_caching": bool(rc.enable_prefix_caching),
        "enable_sleep_mode": bool(rc.enable_sleep_mode),
        "logprobs_mode": rc.logprobs_mode,
        "enforce_eager": bool(rc.enforce_eager),
        "gpu_memory_utilization": float(rc.gpu_memory_utilization),
        "disable_log_stats": bool(rc.disable_log_stats),
        "tensor_parallel_size": int(rc.tensor_model_parallel_size),
        "seed": 0 + int(rc.seed),  # replica 0
        "override_generation_config": {
            "temperature": rc.temperature,
            "top_k": rc.top_k,
            "top_p": rc.top_p,
            "repetition_penalty": 1.0,
            "max_new_tokens": int(rc.response_length),
        },
        "quantization": None,
        "hf_overrides": {},
        "scheduling_policy": rc.scheduling_policy,
        "compilation_config": compilation,
        **engine_kwargs,
    }
    args["enable_expert_parallel"] = int(rc.expert_parallel_size) > 1
    lora = model.get("lora", {}) or {}
    rank = int(lora.get("rank", 0) or 0) or int(model.get("lora_rank", 0) or 0)
    if lora.get("merge", False):
        rank = 0
    if rank > 0:
        max_rank = rank  # vLLM rounds it up to a rank it allows; verl's rounding needs vLLM
        if _has_vllm():
            from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank

            max_rank = get_vllm_max_lora_rank(rank)
        args.update({"enable_lora": True, "max_loras": 1, "max_lora_rank": max_rank})
        if lora.get("fully_sharded_loras", False):
            args["fully_sharded_loras"] = True
    if rc.enable_rollout_routing_replay:
        args["enable_return_routed_experts"] = True
    return args


def verl_server_arg_keys() -> set[str]:
    """The keys of the `args` dict literal in verl's `vLLMHttpServer.launch_server`, read from
    verl's installed source: what `engine_args` must cover (or name in `LEFT_OUT`)."""

    # read, not imported: the module and its package import vLLM
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise RecipeError("verl is not installed: pip install 'verl-recipes[verl]'")
    tree = ast.parse((Path(spec.origin).parent / SERVER_SOURCE).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == "launch_server":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "args" for t in sub.targets)
                    and isinstance(sub.value, ast.Dict)
                ):
                    return {k.value for k in sub.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise RecipeError("verl's vLLMHttpServer.launch_server builds no `args` dict: the installed verl is not 0.9.1")


def step_prompts(cfg: Any, tokenizer: Any, hf_model_type: str | None) -> list[list[int]]:
    """The prompt token ids of step 1's rollout requests, in the order verl sends them (see the
    module doc): verl's sampler, dataset, collate and chat-template builder, `rollout.n` each."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    data = cfg.data
    dataset = create_rl_dataset(data.train_files, data, tokenizer, None, max_samples=data.get("train_max_samples", -1))
    batch_size = int(data.get("gen_batch_size", None) or data.train_batch_size)
    loader = StatefulDataLoader(
        dataset=dataset,
        batch_size=batch_size,
        num_workers=0,
        drop_last=True,
        collate_fn=collate_fn,
        sampler=create_rl_sampler(data, dataset),
    )
    batch = next(iter(loader), None)
    if batch is None:
        raise RecipeError(f"{data.train_files}: fewer rows than one batch of {batch_size}; a step gets no prompts")
    rc = rollout_config(cfg)
    builder = create_continuous_token_builder(
        tokenizer, hf_model_type=hf_model_type, chat_template_kwargs=data.get("apply_chat_template_kwargs", {}) or {}
    )
    cap = int(rc.prompt_length)
    out: list[list[int]] = []
    for messages in batch["raw_prompt"]:
        ids = [int(t) for t in builder.build_initial_tokens(list(messages))]
        # the agent loop's `_cap_text_prompt_length`: a longer prompt keeps its last tokens (its
        # module imports verl's HTTP stack, which a CPU host need not have)
        ids = ids[-cap:] if len(ids) > cap else ids
        out += [ids] * int(rc.n)
    return out


def sampling(cfg: Any, prompts: Sequence[Sequence[int]], max_len: int) -> list[dict[str, Any]]:
    """Each request's `vllm.SamplingParams` keywords, as the agent loop and the server's
    `generate` make them for a training step (not validation)."""
    rc = rollout_config(cfg)
    out = []
    for ids in prompts:
        room = max_len - len(ids)
        if room < 1:
            raise RecipeError(f"a prompt of {len(ids)} tokens leaves no room below max_model_len {max_len}")
        want = min(int(rc.response_length), int(rc.prompt_length) + int(rc.response_length) - len(ids))
        params: dict[str, Any] = {
            "temperature": rc.temperature,
            "top_p": rc.top_p,
            "top_k": rc.top_k,
            "repetition_penalty": 1.0,
            "logprobs": 0 if rc.calculate_log_probs else None,
            "ignore_eos": bool(rc.get("ignore_eos", False)),
            "max_tokens": max(1, min(want, room)),
        }
        if rc.full_determinism:
            params["seed"] = 0 + int(rc.seed)
        out.append(params)
    return out


def summary(per_request: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The sampling settings of a step's requests, said once: the shared ones, and max_tokens's
    range (it differs only where a prompt is long)."""
    shared = {k: v for k, v in per_request[0].items() if k != "max_tokens"}
    tokens = [p["max_tokens"] for p in per_request]
    return {**shared, "max_tokens": max(tokens), "max_tokens_min": min(tokens), "requests": len(per_request)}


def _has_vllm() -> bool:

    return importlib.util.find_spec("vllm") is not None


def vllm_available() -> bool:
    """This host measures: vLLM is installed and NVML sees a GPU."""
    return _has_vllm() and _gpu_count() > 0


def _gpu_count() -> int:

    return len(gpus().get("gpus") or [])


def ensure_model(arch: str) -> Path:
    """The full-width synthetic checkpoint `train` trains on, made (in a process of its own, as
    `train` makes it on a GPU host) when it is missing."""

    path = model_dir(arch, None, "full-width")
    if (path / "synth.json").is_file():
        return path
    cmd = [sys.executable, "-m", "verl_recipes.cli", "synth-model", "--arch", arch, "--scale", "full-width"]
    cmd += ["--device", "cuda", "--out", str(path)]
    print(f"+ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise RecipeError(f"synth-model failed: {shlex.join(cmd)}")
    return path


def ensure_data(data: Path) -> None:
    if not (data / "train.parquet").is_file():
        cmd = [sys.executable, "-m", "verl_recipes.cli", "dataset", "--out", str(data)]
        if subprocess.run(cmd).returncode != 0:
            raise RecipeError(f"dataset failed: {shlex.join(cmd)}")


def measure(
    engine: dict[str, Any], model: Path, prompts: list[list[int]], params: list[dict[str, Any]], calls: int
) -> dict[str, Any]:
    """One warm-up and `calls` timed `generate` calls of the step's requests on one `vllm.LLM`.

    vLLM's engine core is a process of its own; forked from this one, it died on the H200 with
    "Cannot re-initialize CUDA in forked subprocess" (gpu/hosts/2026-12-04-h200x1-rollout: this
    process has touched CUDA by then), so it is started fresh, as verl's vLLM server starts it.
    """
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model), **engine)
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    sp = [SamplingParams(**p) for p in params]
    llm.generate(requests, sp, use_tqdm=False)
    seconds: list[float] = []
    generated: list[int] = []
    longest: list[int] = []
    for _ in range(calls):
        t0 = time.perf_counter()
        outs = llm.generate(requests, sp, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        generated.append(sum(lengths))
        longest.append(max(lengths))
    median = statistics.median(seconds)
    return {
        "calls_s": [round(s, 4) for s in seconds],
        "median_s": round(median, 4),
        "generated_tokens": generated,
        "longest_sample_tokens": longest,
        "decode_ms_per_step": round(1000 * median / max(1, statistics.median(longest)), 3),
    }


def run(args: argparse.Namespace) -> int:

    if args.calls < 1:
        raise RecipeError("--calls must be at least 1")
    if args.out and args.out.exists():
        raise RecipeError(f"--out {args.out} exists; name a new file")
    recipe = get_recipe(args.recipe)
    gpu = vllm_available()
    if not gpu and not args.dry_run:  # before anything loads: one line, not a page of library warnings
        raise RecipeError(NO_GPU)
    data = default_data_dir()
    model = model_dir(recipe.model.arch, None, "full-width")
    # composed as `train` composes it: the recipe's layout, its variants, the --set overrides
    cfg = compose_run(recipe, args.variant, args.sets, gpu_layout(recipe), model=model, data=data)
    hf = model_hf_config(recipe)
    engine = engine_args(cfg, hf)
    rc = rollout_config(cfg)
    gpu = gpu and not args.dry_run
    if gpu:
        ensure_model(recipe.model.arch)
    ensure_data(data)
    if gpu:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    else:
        tokenizer = build_tokenizer(hf)  # the tokenizer synth-model writes beside the weights
    prompts = step_prompts(cfg, tokenizer, getattr(hf, "model_type", None))
    params = sampling(cfg, prompts, engine["max_model_len"])
    print(f"rollout-bench {recipe.id}{''.join(' --variant ' + v for v in args.variant)}: model {model}")
    print("engine arguments (vllm.LLM): " + json.dumps(engine, sort_keys=True, default=str))
    print("sampling (vllm.SamplingParams): " + json.dumps(summary(params), sort_keys=True))
    lengths = [len(p) for p in prompts]
    per = f"{len(prompts) // int(rc.n)} prompts x n={rc.n}"
    print(f"prompts: {len(prompts)} requests ({per}), {min(lengths)}-{max(lengths)} tokens")
    if not gpu:
        print(NEEDS_GPU)
        return 0
    result = measure(engine, model, prompts, params, args.calls)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path("runs") / f"rollout-bench-{'-'.join([recipe.id, *args.variant])}-{stamp}.json"
    rec = {
        "provenance": record([sys.executable, "-m", "verl_recipes.cli", *sys.argv[1:]], {"recipe": recipe.id}),
        "recipe": recipe.id,
        "variants": list(args.variant),
        "sets": list(args.sets),
        "model": str(model),
        "engine_args": engine,
        "sampling": summary(params),
        "prompt_tokens": lengths,
        **result,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    inflight.write_text(out, json.dumps(rec, indent=2, default=str) + "\n", "the rollout-bench record")
    print(f"vLLM alone: {result['median_s']:.2f} s a step's rollout ({args.calls} calls)  ({out})")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rollout-bench", help="vLLM alone on exactly one step's rollout of a recipe")
    p.add_argument("recipe")
    p.add_argument("--variant", action="append", default=[], help="variant from recipe.yaml; repeatable")
    cli_types.add_set_option(p)
    p.add_argument("--calls", type=int, default=3, help="timed generate calls after one warm-up (default 3)")
    p.add_argument("--out", type=Path, help="the JSON record (default runs/rollout-bench-RECIPE-TIME.json)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the engine arguments, sampling and prompts, measure nothing (any host; without a GPU, "
        "the command is refused without it)",
    )
    p.set_defaults(func=run)
