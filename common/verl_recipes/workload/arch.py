"""Model architectures: the bundled config.json files, the one resolver of an `--arch` value, and
the table from Hugging Face model ids to bundled names.

Memory and throughput depend on an architecture's shapes, not its weights, so a recipe names a
bundled architecture (`workload/archs/<name>/config.json`) and every run measures on a synthetic
checkpoint of it. `--arch` (train, synth-model, plan) also takes a config.json, or a folder that
holds one (a real checkpoint).

A verl script names its model as a Hub id or a local folder (`Qwen/Qwen2.5-7B-Instruct`,
`$HOME/models/Qwen3-8B`); `arch_for_model_id` maps its last path component, case-insensitively,
through `MODEL_IDS`, a written table with one row per id: an -Instruct, -Chat or -Base variant is a
row of its own, never a guess from the name. A variant shares a folder only where its config.json
differs in nothing the project reads but special-token ids (archs/SOURCES.md says which). Standard
library only.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError

ARCHS_DIR = Path(__file__).resolve().parent / "archs"

#: Hugging Face repository name (the id's last path component) -> bundled architecture. Where
#: each folder's numbers come from, and why a variant shares one: archs/SOURCES.md.
MODEL_IDS: dict[str, str] = {
    # Qwen2 and Qwen2.5 (Qwen/...)
    "Qwen2-7B": "qwen2-7b",
    "Qwen2-7B-Instruct": "qwen2-7b-instruct",
    "Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b",
    "Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b",
    "Qwen2.5-3B": "qwen2.5-3b",
    "Qwen2.5-3B-Instruct": "qwen2.5-3b",
    "Qwen2.5-7B": "qwen2.5-7b",
    "Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct",
    "Qwen2.5-14B": "qwen2.5-14b",
    "Qwen2.5-14B-Instruct": "qwen2.5-14b-instruct",
    "Qwen2.5-32B": "qwen2.5-32b",
    "Qwen2.5-32B-Instruct": "qwen2.5-32b-instruct",
    "Qwen2.5-72B-Instruct": "qwen2.5-72b-instruct",
    "Qwen2.5-Math-7B": "qwen2.5-math-7b",
    # Qwen3 (Qwen/...; the -Base releases have another context length and are not mapped)
    "Qwen3-0.6B": "qwen3-0.6b",
    "Qwen3-1.7B": "qwen3-1.7b",
    "Qwen3-4B": "qwen3-4b",
    "Qwen3-8B": "qwen3-8b",
    "Qwen3-14B": "qwen3-14b",
    "Qwen3-32B": "qwen3-32b",
    # Llama (meta-llama/...; the 3.1 repositories were first published as Meta-Llama-3.1-*)
    "Llama-2-7b-hf": "llama-2-7b",
    "Llama-2-7b-chat-hf": "llama-2-7b",
    "Llama-2-13b-hf": "llama-2-13b",
    "Llama-2-13b-chat-hf": "llama-2-13b",
    "Llama-2-70b-hf": "llama-2-70b",
    "Llama-2-70b-chat-hf": "llama-2-70b",
    "Llama-3.1-8B": "llama-3.1-8b",
    "Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "Meta-Llama-3.1-8B": "llama-3.1-8b",
    "Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "Llama-3.2-3B": "llama-3.2-3b",
    "Llama-3.2-3B-Instruct": "llama-3.2-3b",
    # DeepSeek (deepseek-ai/...), Mistral (mistralai/...), Gemma 2 (google/...)
    "deepseek-llm-7b-chat": "deepseek-llm-7b-chat",
    "Mistral-7B-v0.1": "mistral-7b-v0.1",
    "Mistral-Nemo-Instruct-2407": "mistral-nemo-instruct-2407",
    "gemma-2-2b-it": "gemma-2-2b-it",
    "gemma-2-9b-it": "gemma-2-9b-it",
}
_BY_NAME = {k.lower(): v for k, v in MODEL_IDS.items()}

_MULTIMODAL = "a multimodal model; the planner models text LMs"
_MOE = "a mixture-of-experts model; the planner models dense LMs"
_REWARD = "a reward model (a sequence classifier); give the config.json of its base LM"
_UNVERIFIED = "a dense LM whose config.json is not bundled"
#: Ids verl's examples name that have no bundled architecture, and why: said in place of a
#: did-you-mean that would point a multimodal or MoE id at its dense namesake.
NOT_BUNDLED: dict[str, str] = {
    **dict.fromkeys(
        (
            "Qwen2.5-VL-3B-Instruct",
            "Qwen2.5-VL-7B-Instruct",
            "Qwen2.5-VL-32B-Instruct",
            "Qwen3-VL-2B-Instruct",
            "Qwen3-VL-8B-Instruct",
            "Qwen3-VL-30B-A3B-Instruct",
            "Qwen3-VL-235B-A22B-Instruct",
            "GLM-4.1V-9B-Thinking",
            "MiniCPM-o-2_6",
        ),
        _MULTIMODAL,
    ),
    **dict.fromkeys(
        (
            "Qwen3-30B-A3B",
            "Qwen3-30B-A3B-Base",
            "Qwen3-30B-A3B-Instruct-2507",
            "Qwen3-235B-A22B",
            "Qwen1.5-MoE-A2.7B-Chat",
            "Moonlight-16B-A3B",
            "Moonlight-16B-A3B-Instruct",
            "DeepSeek-V3",
            "gpt-oss-20b",
        ),
        _MOE,
    ),
    **dict.fromkeys(
        (
            "FsfairX-LLaMA3-RM-v0.1",
            "Skywork-Reward-Llama-3.1-8B",
            "Skywork-Reward-Llama-3.1-8B-v0.2",
            "Skywork-Reward-V2-Llama-3.2-3B",
        ),
        _REWARD,
    ),
    **dict.fromkeys(
        ("Qwen2-72B-Instruct", "Qwen2.5-Coder-14B-Instruct", "QwQ-32B", "Seed-OSS-36B-Base", "MiMo-7B-RL"),
        _UNVERIFIED,
    ),
}
_NOT_BUNDLED = {k.lower(): v for k, v in NOT_BUNDLED.items()}


def bundled_archs() -> list[str]:
    """The names of the bundled architectures."""
    return sorted(p.name for p in ARCHS_DIR.iterdir() if (p / "config.json").is_file())


def arch_config_path(arch: str | Path) -> Path:
    """A bundled name, a folder holding a config.json, or a config.json -> that config.json."""
    bundled = ARCHS_DIR / str(arch) / "config.json"
    if bundled.is_file():
        return bundled
    path = Path(arch)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise RecipeError(f"--arch {arch}: not a bundled arch ({', '.join(bundled_archs())}) nor a config.json path")
    return path


def resolve_arch(arch: str | Path) -> dict[str, Any]:
    """The config dict of `arch` (see arch_config_path), checked to be an HF model config."""
    path = arch_config_path(arch)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecipeError(f"--arch {path}: not valid JSON ({e}); pass an HF config.json") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise RecipeError(f"--arch {path}: no model_type; pass an HF config.json")
    return cfg


def arch_for_model_id(model_id: str) -> str:
    """The bundled architecture of a Hub id or model folder, by its last path component.

    `Qwen/Qwen2.5-7B-Instruct`, `~/models/qwen2.5-7b-instruct/` and `$HOME/models/Qwen3-8B` all
    resolve; the organisation and the folders above are not read (a local copy lives anywhere).
    Anything not in `MODEL_IDS` is one line naming the way out (`--arch`), the bundled names, and
    why the id is out (`NOT_BUNDLED`) or else the nearest id.
    """
    name = str(model_id).strip().rstrip("/").rsplit("/", 1)[-1]
    arch = _BY_NAME.get(name.lower())
    if arch is not None:
        return arch
    why = _NOT_BUNDLED.get(name.lower())
    close = [] if why else difflib.get_close_matches(name.lower(), list(_BY_NAME), n=1, cutoff=0.6)
    hint = f"; did you mean {next(k for k in MODEL_IDS if k.lower() == close[0])}?" if close else ""
    raise RecipeError(
        f"unknown model id {model_id}{f' ({why})' if why else ''}: pass --arch NAME|config.json; "
        f"bundled: {', '.join(bundled_archs())}{hint}"
    )
