"""What verl checks of a composed config before Ray starts, checked here first, on any host.

`verl-recipes train`'s pre-flight runs these on the config as it will run, so what a GPU host's
``main_ppo`` would refuse at start-up a CPU preview refuses first, in one line: the data files
the config names (against what verl reads from them, `workload.userpaths.check_parquet`) and verl's
own start-up validation, `verl.utils.config.validate_config`. verl loads inside the function that
runs its check: reading a recipe needs no verl.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_recipes import RecipeError
from verl_recipes.workload.userpaths import MAKE_DATA, check_parquet

if TYPE_CHECKING:
    from omegaconf import DictConfig

VAL_MISSING = (
    "add a test.parquet (verl's validation set) in the same layout next to train.parquet, or pass "
    "--set data.val_files=FILE (nothing is written into your folder)"
)


def check(cfg: DictConfig, ours: Path, shape: dict[str, Any] | None) -> list[str]:
    """The composed job's data files and verl's start-up checks; returns what to print, raises the
    refusal. `ours` is the embedded dataset's folder (made when missing); `shape` the config.json
    of the synthetic checkpoint the job makes after the checks (None: the config's model path is
    the user's checkpoint, already there)."""
    note = verl_validate(cfg, shape)
    check_data(cfg, ours)
    nodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    lines = [f"layout: {nodes} node(s) x {per_node} GPU(s), checked; verl's start-up checks pass"]
    return lines + ([f"note: {note}"] if note else [])


def check_data(cfg: DictConfig, ours: Path) -> None:
    """The data files the config names, unless they are the embedded dataset under `ours` (made
    when missing) or remote (verl copies those in; this host cannot look)."""
    from omegaconf import OmegaConf

    prompt_key = str(OmegaConf.select(cfg, "data.prompt_key") or "prompt")
    batch = int(OmegaConf.select(cfg, "data.train_batch_size"))
    for key, rows, missing in (("data.train_files", batch, MAKE_DATA), ("data.val_files", 1, VAL_MISSING)):
        raw = OmegaConf.select(cfg, key)
        listed = OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else [raw]
        files = listed if isinstance(listed, list) else [listed]
        for f in files:
            path = Path(str(f)).expanduser()
            if path.parent == ours or "://" in str(f):
                continue
            # Several files make one dataset: only a lone file must hold a batch by itself.
            check_parquet(path, prompt_key, rows if len(files) == 1 else 1, f"{key}:", missing)


_NO_VLLM = "verl's LoRA-rank check for vLLM needs vLLM, which this host lacks; a GPU host runs it"


def _vllm_absent(e: BaseException) -> bool:
    """Whether `e` is verl's import of vLLM failing because no vLLM is installed.

    verl's LoRA-rank check (the last of `validate_config`, for an adapter vLLM receives unmerged)
    imports `verl.third_party.vllm`, which raises ValueError ("vllm version None not supported"),
    not ImportError, when the package is missing: on a CPU host that is a host without vLLM, not a
    configuration verl refuses.
    """
    if importlib.util.find_spec("vllm") is not None:
        return False
    frames = traceback.extract_tb(e.__traceback__)
    return isinstance(e, ValueError) and any("/verl/third_party/vllm/" in f.filename for f in frames)


def verl_validate(cfg: DictConfig, shape: dict[str, Any] | None = None) -> str | None:
    """verl's start-up validation on a copy; a refusal is one RecipeError line. Returns a note when
    a check needs a package this host lacks (vLLM's LoRA ranks on a CPU host).

    verl builds the critic's model config from the checkpoint folder while it validates. Before a
    synthetic checkpoint exists, `shape` (its config.json) stands in for it in a scratch folder,
    and its tokenizer, which `synth-model` makes with it, is not loaded.
    """
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = copy.deepcopy(cfg)
    with tempfile.TemporaryDirectory(prefix="verl-recipes-shape-") as tmp:
        if shape is not None:
            (Path(tmp) / "config.json").write_text(json.dumps(shape))
            with open_dict(cfg):
                cfg.critic.model.path = cfg.critic.model.tokenizer_path = tmp
                cfg.critic.model.load_tokenizer = False
        said = io.StringIO()  # verl prints its verdict and notices; ours is one line
        try:
            with contextlib.redirect_stdout(said):
                validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        except ImportError as e:  # the last check imports vLLM for the LoRA ranks it allows
            if "vllm" not in str(e.name or e):
                raise
            return _NO_VLLM
        except Exception as e:  # verl raises AssertionError, ValueError and Hydra's InstantiationException
            if _vllm_absent(e):
                return _NO_VLLM
            msg = " ".join(str(e).split()) or type(e).__name__
            raise RecipeError(f"verl refuses the configuration at start-up: {msg}") from None
    notes = [x for x in said.getvalue().splitlines() if x.strip() and "All configuration checks passed" not in x]
    return "; ".join(f"verl: {x.strip()}" for x in notes) or None
