"""`verl-recipes synth-model`: a random-weight HF checkpoint and a local tokenizer from a config.json.

Memory and throughput depend on the architecture's shapes, not on its weights, and the GPU
hosts cannot download checkpoints. So recipes measure on a checkpoint written here from a
bundled config (`verl_recipes/workload/archs/<name>/config.json`) or any config.json: same shapes, random
weights, a byte-level BPE tokenizer trained in about a second on the embedded arithmetic text,
and a ChatML-style chat template. A real checkpoint goes through the same `load_for_check`.

Why the writer streams: a 13B checkpoint is 26 GB in bf16. The model is built on the meta
device only to learn the tensor names and shapes; each tensor is then drawn (on the GPU with
`--device cuda`, where drawing is free) and written straight into a safetensors shard, so a CPU
host holds a few tensors at a time, never a whole model, and nothing runs HF's per-module init.

Why the tokenizer fills the whole vocabulary: a random model emits any id below `vocab_size`,
and a rollout engine must detokenize every one. The trained BPE covers a few thousand ids, the
config's bos/eos/pad ids get their special tokens, and the remaining ids get inert filler
tokens, so `len(tokenizer) == vocab_size` and every id decodes.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_recipes import RecipeError, __version__, cli_types, inflight
from verl_recipes.paths import cache_dir
from verl_recipes.workload.arch import bundled_archs, resolve_arch
from verl_recipes.workload.dataset import corpus

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

MAX_SHARD_BYTES = 5 * 1000**3  # HF's "5GB" (decimal), the size save_pretrained uses by default
INIT_STD = 0.02
TINY = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 4,
    "max_kv_heads": 4,
    "layers": 2,
}
DTYPES = {"bf16": ("bfloat16", "BF16"), "fp16": ("float16", "F16"), "fp32": ("float32", "F32")}
SYNTH_JSON = "synth.json"  # written last: a folder holding it is a complete synth-model output
TRAINED_VOCAB = 4096  # BPE tokens learned from the corpus; the rest of the vocabulary is filler
CORPUS_LINES = 3000
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen2 uses; `add_generation_prompt` opens the assistant turn that verl's rollout fills.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ---------------------------------------------------------------------------------------------
# Configs


def model_dir(arch: str, layers: int | None, scale: str, out: Path | None = None, weights: bool = True) -> Path:
    """Where the synthetic checkpoint of `arch` at this shape is kept (known before it is made):
    `train` trains on it and `rollout-bench` generates on it, so both find the one made first.
    A folder without weights (`synthesize(weights=False)`) has a name of its own."""
    return out or cache_dir() / "models" / f"{arch}-{scale}-L{layers or 'all'}{'' if weights else '-noweights'}"


def shape_config(raw: dict[str, Any], layers: int | None = None, scale: str = "full-width") -> dict[str, Any]:
    """The config.json dict, truncated to `layers` and, for scale 'tiny', shrunk in width.

    'tiny' keeps the family (model type, vocabulary, GQA, biases, tying) but uses hidden 256,
    4 heads and 2 layers, so a CPU forward and a few PPO steps take seconds.
    """
    cfg = dict(raw)
    orig_layers = int(cfg["num_hidden_layers"])
    if scale == "tiny":
        heads = TINY["num_attention_heads"]
        kv = min(TINY["max_kv_heads"], int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]))
        while heads % kv:
            kv -= 1
        cfg.update(
            hidden_size=TINY["hidden_size"],
            intermediate_size=TINY["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=kv,
        )
        if "head_dim" in cfg:
            cfg["head_dim"] = TINY["hidden_size"] // heads
        layers = layers or TINY["layers"]
    elif scale != "full-width":
        raise RecipeError(f"--scale {scale}: use full-width or tiny")
    if layers is not None:
        if not 1 <= layers <= orig_layers:
            raise RecipeError(f"--layers {layers}: the arch has {orig_layers} layers; pass 1..{orig_layers}")
        cfg["num_hidden_layers"] = layers
        if "max_window_layers" in cfg:
            cfg["max_window_layers"] = min(int(cfg["max_window_layers"]), layers)
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][:layers]
    return cfg


def hf_config(cfg: dict[str, Any], dtype: str = "bf16") -> PretrainedConfig:
    """A transformers config object from a config.json dict, with the checkpoint dtype set."""
    import torch
    from transformers import AutoConfig

    if dtype not in DTYPES:
        raise RecipeError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    kw = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype", "dtype", "transformers_version")}
    try:
        config = AutoConfig.for_model(cfg["model_type"], **kw)
    except ValueError as e:
        raise RecipeError(f"model_type {cfg['model_type']!r}: transformers does not know it ({e})") from None
    config.dtype = getattr(torch, DTYPES[dtype][0])
    return config


def meta_model(config: PretrainedConfig) -> PreTrainedModel:
    """The causal-LM module on the meta device: shapes and names, no memory, no init."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def count_params(cfg: dict[str, Any]) -> int:
    """Parameter count of a config.json dict, from the real HF module on the meta device.

    Tied embeddings count once, as `model.parameters()` deduplicates them.
    """
    return sum(p.numel() for p in meta_model(hf_config(cfg)).parameters())


# ---------------------------------------------------------------------------------------------
# Weights


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]
    fill: str  # "normal", "ones" or "zeros"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _norm_fill(norm: Any) -> str:
    """A norm weight as its own module initialises it: ones for Llama-style RMSNorm (x * w), zeros
    for Gemma's (x * (1 + w)), so every family's synthetic norm is the identity scale."""
    import torch

    with torch.device("cpu"):
        w = type(norm)(int(norm.weight.shape[0])).weight
    value = float(w.detach()[0])
    if value not in (0.0, 1.0):  # pragma: no cover - a norm class with another init
        raise RecipeError(f"{type(norm).__name__} initialises its weight to {value}; synth-model knows 0 and 1")
    return "ones" if value == 1.0 else "zeros"


def tensor_plan(model: PreTrainedModel) -> list[_Tensor]:
    """What the checkpoint holds: each unique parameter, norms as their module initialises them
    (`_norm_fill`), the rest normal."""
    persistent = set(model.state_dict()) - {n for n, _ in model.named_parameters(remove_duplicate=False)}
    if persistent:
        raise RecipeError(
            f"{type(model).__name__} has persistent buffers ({sorted(persistent)[0]}, ...); use another arch"
        )
    plan = []
    fills: dict[type, str] = {}
    for name, p in model.named_parameters():  # deduplicated: a tied lm_head is not written, as HF does
        owner, leaf = name.rsplit(".", 1)
        fill = "normal"
        if p.dim() == 1 and "norm" in owner.rsplit(".", 1)[-1]:  # e.g. input_layernorm.weight, q_norm.weight
            norm = model.get_submodule(owner)
            if leaf == "bias":
                fill = "zeros"
            else:
                if type(norm) not in fills:
                    fills[type(norm)] = _norm_fill(norm)
                fill = fills[type(norm)]
        plan.append(_Tensor(name, tuple(p.shape), fill))
    return plan


def shard_plan(plan: list[_Tensor], itemsize: int, max_bytes: int = MAX_SHARD_BYTES) -> list[list[_Tensor]]:
    """Greedy shards of at most `max_bytes` (a single larger tensor gets a shard of its own)."""
    shards: list[list[_Tensor]] = [[]]
    size = 0
    for t in plan:
        b = t.numel * itemsize
        if shards[-1] and size + b > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += b
    return shards


def _header(tensors: list[_Tensor], st_dtype: str, itemsize: int) -> bytes:
    """A safetensors header: JSON of name -> dtype, shape, byte range, padded to 8 bytes."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        end = off + t.numel * itemsize
        meta[t.name] = {"dtype": st_dtype, "shape": list(t.shape), "data_offsets": [off, end]}
        off = end
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _draw(plan: list[_Tensor], dtype: torch.dtype, device: str, seed: int) -> Iterator[torch.Tensor]:
    """The tensors of `plan`, in order, drawn on `device` and returned on the CPU."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    for t in plan:
        if t.fill in ("ones", "zeros"):
            x = (torch.ones if t.fill == "ones" else torch.zeros)(t.shape, dtype=dtype, device=device)
        else:
            x = torch.empty(t.shape, dtype=dtype, device=device).normal_(0.0, INIT_STD, generator=gen)
        yield x.cpu()


#: the shard an index without weights names; no such file is written
ABSENT_SHARD = "no-weights-written.safetensors"


def write_key_index(out: Path, plan: list[_Tensor]) -> int:
    """Name every weight of the model in a safetensors index, with no shard behind it; returns 0 bytes.

    Megatron-Bridge's weight export (verl's sync of a Megatron actor into vLLM) lists the HF names
    to convert from the checkpoint's safetensors index (``SafeTensorsStateSource.get_all_keys``)
    and refuses a folder with neither shards nor index. A folder written without weights keeps
    that list, and still holds no weight file for a loader to read (`megatron_rehearsal.has_weights`).
    """
    index = {"metadata": {"total_size": 0}, "weight_map": {t.name: ABSENT_SHARD for t in plan}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


def write_weights(
    out: Path,
    plan: list[_Tensor],
    dtype: str = "bf16",
    device: str = "cpu",
    seed: int = 0,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> int:
    """Stream random tensors into safetensors shards (and an index if sharded); returns bytes.

    A writer thread overlaps disk writes with drawing; the queue bounds memory to a few tensors.
    """
    import torch

    tdtype = getattr(torch, DTYPES[dtype][0])
    st_dtype = DTYPES[dtype][1]
    itemsize = torch.empty((), dtype=tdtype).element_size()
    shards = shard_plan(plan, itemsize, max_shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]

    q: queue.Queue[torch.Tensor | None] = queue.Queue(maxsize=2)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for name, tensors in zip(names, shards, strict=True):
                with open(out / name, "wb") as f:
                    f.write(_header(tensors, st_dtype, itemsize))
                    for _ in tensors:
                        x = q.get()
                        if x is None:  # the producer stopped early (an error or Ctrl-C in its thread)
                            return
                        f.write(x.contiguous().view(-1).view(torch.uint8).numpy().data)
        except BaseException as e:  # surfaced in the caller's thread
            errors.append(e)
            while q.get() is not None:  # drain so the producer never blocks
                pass

    th = threading.Thread(target=writer, name="synth-writer", daemon=True)
    th.start()
    try:
        for x in _draw(plan, tdtype, device, seed):
            q.put(x)
            if errors:
                break
    finally:
        q.put(None)
        th.join()
    if errors:
        raise errors[0]

    total = sum(t.numel for t in plan) * itemsize
    if n > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t.name: name for name, ts in zip(names, shards, strict=True) for t in ts},
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return sum((out / name).stat().st_size for name in names)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def special_tokens(config: PretrainedConfig) -> dict[str, Any]:
    """Special tokens at the config's ids, plus ChatML turn markers next to them.

    Returns {"vocab": {token: id}, "bos": tok, "eos": tok, "pad": tok, "extra": [toks]} and
    writes any id the config lacked back into `config`.
    """
    vocab = int(config.vocab_size)
    bos_ids, eos_ids, pad_ids = (
        _ids(config.bos_token_id),
        _ids(config.eos_token_id),
        _ids(config.pad_token_id),
    )
    taken: dict[int, str] = {}

    def free_ids() -> Iterator[int]:
        start = max(taken) + 1 if taken else 0
        yield from (i for i in range(start, vocab) if i not in taken)
        yield from (i for i in range(vocab) if i not in taken)

    def place(ids: list[int], name: str) -> str:
        """Name the first id (or the next free one); an id already named keeps its name."""
        i = ids[0] if ids else next(free_ids())
        if not 0 <= i < vocab:
            raise RecipeError(f"special token id {i} is outside vocab_size {vocab}; fix the config.json")
        return taken.setdefault(i, name)

    bos = place(bos_ids, "<|endoftext|>" if bos_ids and bos_ids[:1] == eos_ids[:1] else "<s>")
    eos = place(eos_ids, "</s>")
    extra = [place([i], f"<|eos_{k}|>") for k, i in enumerate(eos_ids[1:], start=1)]
    pad = place(pad_ids, "<pad>") if pad_ids else eos
    extra += [place([], IM_START), place([], IM_END)]
    by_name = {t: i for i, t in taken.items()}
    config.bos_token_id = by_name[bos]
    config.eos_token_id = by_name[eos] if len(eos_ids) <= 1 else eos_ids
    config.pad_token_id = by_name[pad]
    extra = [t for t in dict.fromkeys(extra) if t not in (bos, eos, pad)]
    return {"vocab": {t: i for i, t in taken.items()}, "bos": bos, "eos": eos, "pad": pad, "extra": extra}


def build_tokenizer(config: PretrainedConfig, seed: int = 0) -> Any:
    """A PreTrainedTokenizerFast whose ids cover exactly 0..vocab_size-1 (see the module doc)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    vocab_size = int(config.vocab_size)
    sp = special_tokens(config)
    reserved: dict[str, int] = sp["vocab"]
    if vocab_size < 256 + len(reserved) + 1:
        raise RecipeError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer; use >= 512")

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=min(TRAINED_VOCAB, vocab_size - len(reserved)),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre
    base.train_from_iterator(corpus(CORPUS_LINES, seed), trainer)
    model_json = json.loads(base.to_str())["model"]
    trained = sorted(model_json["vocab"].items(), key=lambda kv: kv[1])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]

    # Lay the vocabulary out: specials at their ids, trained tokens in the lowest free ids, filler after.
    vocab: dict[str, int] = dict(reserved)
    special_ids = set(reserved.values())
    free = (i for i in range(vocab_size) if i not in special_ids)
    for tok, _ in trained:
        vocab[tok] = next(free)
    for k, i in enumerate(free):
        vocab[f"<|reserved_{k}|>"] = i

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    for t, i in reserved.items():
        if tok.token_to_id(t) != i:  # pragma: no cover - a tokenizers behaviour change
            raise RecipeError(f"tokenizers placed {t} at {tok.token_to_id(t)}, not {i}; pin tokenizers")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=sp["bos"],
        eos_token=sp["eos"],
        pad_token=sp["pad"],
        additional_special_tokens=sp["extra"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=int(getattr(config, "max_position_embeddings", 4096) or 4096),
    )


# ---------------------------------------------------------------------------------------------
# The command


def synthesize(
    arch: str,
    out: Path,
    layers: int | None = None,
    scale: str = "full-width",
    dtype: str = "bf16",
    device: str = "cpu",
    seed: int = 0,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    weights: bool = True,
) -> dict[str, Any]:
    """Write the checkpoint, tokenizer and synth.json into `out`; returns the provenance dict.

    Without `weights`, only the config, generation config and tokenizer: what a job needs whose
    trainer initialises its own weights and whose rollout draws dummy ones (a Megatron rank
    rehearsal at 70B widths, whose checkpoint would not fit the host's disk).

    `out` is claimed (a second writer gets one line naming this one) and built under a temporary
    name, renamed into place only when complete: an interrupted or killed writer leaves `out` as
    it was, so a later run never finds half a model there. A cache entry that an older writer left
    without its synth.json is its own incomplete entry, and is written again.
    """
    import torch

    t0 = time.perf_counter()
    if device == "cuda" and not torch.cuda.is_available():
        raise RecipeError("--device cuda but torch sees no CUDA device; use --device cpu")
    out = Path(os.path.abspath(out))
    held = inflight.claim(out, "the synthetic model")
    try:
        if out.exists() and not out.is_dir():
            raise RecipeError(f"--out {out} is a file; pass a new folder")
        if out.exists() and any(out.iterdir()) and not (out / SYNTH_JSON).is_file():
            if not out.is_relative_to(os.path.abspath(cache_dir())):
                raise RecipeError(f"--out {out} is not empty and not a synth-model output; pass a new folder")
            # the cache's own entry, left by a writer that stopped before its synth.json: replaced
            print(f"{out}: an incomplete synthetic model in the cache; writing it again", file=sys.stderr)
        with inflight.staged_dir(out, "the synthetic model") as tmp:
            info = _synthesize_into(tmp, arch, layers, scale, dtype, device, seed, max_shard_bytes, t0, weights)
    finally:
        held.release()
    return info


def _synthesize_into(
    out: Path,
    arch: str,
    layers: int | None,
    scale: str,
    dtype: str,
    device: str,
    seed: int,
    max_shard_bytes: int,
    t0: float,
    weights: bool = True,
) -> dict[str, Any]:
    """`synthesize` into the fresh folder `out`; synth.json, written last, marks it complete."""
    import torch
    import transformers
    from transformers import GenerationConfig

    cfg = shape_config(resolve_arch(arch), layers, scale)
    config = hf_config(cfg, dtype)
    tokenizer = build_tokenizer(config, seed)  # may fill in special token ids on config
    model = meta_model(config)
    config.architectures = [type(model).__name__]
    plan = tensor_plan(model)
    params = sum(t.numel for t in plan)

    config.save_pretrained(out)
    gen = GenerationConfig.from_model_config(config)
    gen.eos_token_id = [*_ids(config.eos_token_id), tokenizer.convert_tokens_to_ids(IM_END)]
    gen.save_pretrained(out)
    tokenizer.save_pretrained(out)
    t1 = time.perf_counter()
    written = write_weights(out, plan, dtype, device, seed, max_shard_bytes) if weights else write_key_index(out, plan)
    t2 = time.perf_counter()

    info = {
        "arch": arch,
        "model_type": config.model_type,
        "layers": config.num_hidden_layers,
        "scale": scale,
        "dtype": dtype,
        "device": device,
        "seed": seed,
        "params": params,
        "weights": weights,
        "bytes": written,
        "vocab_size": config.vocab_size,
        "tokenizer_len": len(tokenizer),
        "seconds": {"setup": round(t1 - t0, 2), "weights": round(t2 - t1, 2), "total": round(t2 - t0, 2)},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "verl_recipes": __version__,
        },
    }
    (out / SYNTH_JSON).write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_for_check(path: str | Path, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load a checkpoint folder (synthetic or a real HF one) as verl's workers do: Auto classes.

    Returns (model, tokenizer). Missing or mis-shaped weights are an error, not a warning, so a
    broken checkpoint cannot silently train from random init.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise RecipeError(f"{path} has no config.json; pass a HF checkpoint folder")
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype if dtype is not None else "auto", output_loading_info=True
    )
    model, info = loaded
    bad = list(info.get("missing_keys") or []) + [str(m) for m in info.get("mismatched_keys") or []]
    if bad:
        raise RecipeError(f"{path}: checkpoint lacks or mis-shapes {len(bad)} weights (e.g. {bad[0]}); rewrite it")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.to(device).eval(), tokenizer


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "synth-model",
        help="write a random-weight HF checkpoint and tokenizer from a config.json",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--arch", required=True, help=f"bundled ({', '.join(bundled_archs())}) or a config.json path")
    p.add_argument("--layers", type=cli_types.count, default=None, help="keep the first N decoder layers")
    p.add_argument("--scale", choices=["full-width", "tiny"], default="full-width")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where weights are drawn")
    p.add_argument("--seed", type=cli_types.non_negative, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--no-weights", action="store_true", help="config and tokenizer only (the trainer initialises the weights)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = synthesize(
        args.arch, args.out, args.layers, args.scale, args.dtype, args.device, args.seed, weights=not args.no_weights
    )
    gb = info["bytes"] / 1e9
    print(
        f"{args.out}: {info['model_type']} {info['layers']} layers ({info['scale']}), "
        f"{info['params']:,} params, {info['bytes']:,} bytes ({gb:.2f} GB) in {info['seconds']['total']} s"
    )
    return 0
