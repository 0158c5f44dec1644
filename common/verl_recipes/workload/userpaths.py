"""The folders a user hands `train`: their data and model checked up front, their inputs never written.

A launcher that writes into what it was given loses data: a dataset generator run into a data
folder replaces the user's train.parquet, and a new run written into a finished run's folder
replaces its command.sh and verl_config.yaml. So each path is either read only (`--model`,
`--data`, `--set data.train_files=...`) or a folder this tool owns: `--run-dir` new or empty (or,
with `--resume`, a run this tool started), `--model-out` new or empty or a `synth-model` output of
the same shape. Anything else is refused in one line before anything is made or written.

What verl 0.9.1 reads from each parquet row, and so what is checked:
  * `RLHFDataset` (verl/utils/dataset/rl_dataset.py) builds the prompt from the column named by
    `data.prompt_key` ("prompt"): a list of chat messages, each with `role` and `content`; a row
    it cannot template is skipped with a traceback, so a missing column costs a screen of them;
  * every reward manager (verl/experimental/reward_loop/reward_manager/*.py, e.g. naive.py) reads
    `data_source` and `reward_model["ground_truth"]`;
  * the trainer's loader drops a partial batch and asserts "Train dataloader is empty!", so the
    training file needs at least `data.train_batch_size` rows.
A model folder needs what verl's workers load with the Auto classes: config.json, a tokenizer
(tokenizer.json, a sentencepiece tokenizer.model, or vocab.json with merges.txt) and weights.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, inflight, rundir

# What `train` and `report` write into a run folder; one of them marks a folder as a run.
RUN_FILES = (
    rundir.COMMAND,
    rundir.CONFIG,
    rundir.PROVENANCE,
    rundir.LOG,
    rundir.EXIT_CODE,
    rundir.SUMMARY,
    rundir.INCOMPLETE,
)
# Kept in place when a run is resumed; everything else of the earlier attempt moves to attempt-N/.
RESUME_KEEP = (rundir.COMMAND, rundir.CONFIG, rundir.CHECKPOINTS)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json + merges.txt")
MAKE_DATA = "`verl-recipes dataset --out NEW_DIR` writes an example in that layout"


def check_model_dir(path: Path, flag: str = "--model") -> dict[str, Any]:
    """A Hugging Face checkpoint folder verl can load; returns its config.json. One line names
    everything missing and how to make it."""
    if not path.is_dir():
        raise RecipeError(
            f"{flag} {path}: no such folder; point it at a Hugging Face checkpoint folder "
            "(config.json, tokenizer, weights)"
        )
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise RecipeError(f"{flag} {path}: no config.json there; point it at a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecipeError(f"{flag} {cfg_file}: not valid JSON ({e}); it must be a Hugging Face config.json") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise RecipeError(f"{flag} {cfg_file}: no model_type; it must be a Hugging Face config.json")
    missing = []
    has_tok = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model")) or (
        (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
    )
    if not has_tok:
        missing.append(f"no tokenizer ({', '.join(TOKENIZER_FILES)})")
    weights = _weights(path)
    if weights:
        missing.append(weights)
    if missing:
        raise RecipeError(
            f"{flag} {path}: {' and '.join(missing)}; copy them from the checkpoint it came from, or make a "
            f"complete synthetic checkpoint of this config.json with `verl-recipes synth-model --arch {cfg_file} "
            "--out NEW_DIR` and pass that"
        )
    return cfg


def _weights(path: Path) -> str | None:
    """What is wrong with the folder's weights, or None."""
    for index in (path / "model.safetensors.index.json", path / "pytorch_model.bin.index.json"):
        if not index.is_file():
            continue
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (json.JSONDecodeError, AttributeError):
            return f"an unreadable {index.name}"
        lost = sorted(s for s in shards if not (path / s).is_file())
        return f"no {lost[0]} (of {len(shards)} shards in {index.name})" if lost else None
    if any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin")):
        return None
    return "no weights (*.safetensors or pytorch_model*.bin)"


def check_data_dir(path: Path) -> None:
    """`--data DIR` is a folder; its train.parquet and test.parquet are checked as the config names
    them (`check_parquet`), and nothing is ever generated into it."""
    if not path.is_dir():
        raise RecipeError(f"--data {path}: no such folder; give a folder with train.parquet and test.parquet")


def check_parquet(path: Path, prompt_key: str, min_rows: int, what: str, missing: str = MAKE_DATA) -> None:
    """One data file against what verl's dataset, reward managers and loader read (module doc);
    `missing` says how to make it when it does not exist."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise RecipeError(f"{what} {path}: no such file; {missing}")
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as e:
        raise RecipeError(f"{what} {path}: not a parquet file ({e}); {MAKE_DATA}") from None
    names = set(schema.names)
    lacks = []
    if prompt_key not in names:
        lacks.append(f"{prompt_key} (data.prompt_key, read by verl's RLHFDataset)")
    for col in ("data_source", "reward_model"):
        if col not in names:
            lacks.append(f"{col} (read by verl's reward manager)")
    if lacks:
        raise RecipeError(
            f"{what} {path}: no column {', '.join(lacks)}; its columns are {', '.join(sorted(names)) or 'none'}: "
            f"{MAKE_DATA}, or set data.prompt_key to your prompt column"
        )
    prompt = schema.field(prompt_key).type
    fields = set()
    if pa.types.is_list(prompt) or pa.types.is_large_list(prompt):
        item = prompt.value_type
        fields = {item.field(i).name for i in range(item.num_fields)} if pa.types.is_struct(item) else set()
    if not {"role", "content"} <= fields:
        raise RecipeError(
            f"{what} {path}: column {prompt_key} is {prompt}, not chat messages (a list of {{role, content}}) "
            f"as verl's RLHFDataset templates them; {MAKE_DATA}"
        )
    rm = schema.field("reward_model").type
    if not (pa.types.is_struct(rm) and any(rm.field(i).name == "ground_truth" for i in range(rm.num_fields))):
        raise RecipeError(
            f"{what} {path}: column reward_model is {rm}, without the ground_truth the reward manager reads; "
            f"{MAKE_DATA}"
        )
    if meta.num_rows < min_rows:
        raise RecipeError(
            f"{what} {path}: {meta.num_rows} row(s), fewer than data.train_batch_size={min_rows}: verl's loader "
            "drops the partial batch and has none; add rows or lower data.train_batch_size"
        )


def holds_run(path: Path) -> list[str]:
    """The run files in `path` (empty when it is not a run folder)."""
    return [f for f in RUN_FILES if (path / f).exists()]


def check_run_dir(path: Path, resume: bool) -> bool:
    """`--run-dir` is new or empty, or (with --resume) a run folder; returns True to resume."""
    if path.exists() and not path.is_dir():
        raise RecipeError(f"--run-dir {path} is a file; pass a new folder")
    if not path.is_dir() or not any(path.iterdir()):
        if resume:  # a typo in the folder would otherwise start a new run where a requeue expects the old one
            state = "does not exist" if not path.exists() else "is empty"
            raise RecipeError(
                f"--resume: --run-dir {path} {state}, so there is no run to continue; pass the folder of the "
                "run to continue, or drop --resume to start a new run"
            )
        return False
    found = holds_run(path)
    if found and resume:
        if not (path / rundir.CONFIG).is_file():
            again = " (it was stopped before its config was written: run again without --resume)"
            raise RecipeError(
                f"--run-dir {path}: no {rundir.CONFIG} to resume; pass a new folder"
                + (again if is_incomplete(path) else "")
            )
        return True
    if found:
        raise RecipeError(
            f"--run-dir {path} holds a run already ({', '.join(found)}); pass a new folder, or --resume to "
            "continue that run from its checkpoints"
        )
    raise RecipeError(f"--run-dir {path} is not empty and holds no run; pass a new or empty folder")


def check_model_out(path: Path, arch: str, layers: int, scale: str) -> None:
    """`--model-out` is new, empty, or a synth-model output of the same shape (then reused)."""
    if not path.exists():
        return
    if not path.is_dir():
        raise RecipeError(f"--model-out {path} is a file; pass a new folder")
    info = path / "synth.json"
    if not info.is_file():
        if any(path.iterdir()):
            raise RecipeError(
                f"--model-out {path} is not empty and holds no synthetic model; pass a new folder "
                "(nothing is written into it)"
            )
        return
    try:
        made = json.loads(info.read_text())
    except json.JSONDecodeError:
        raise RecipeError(f"--model-out {path}: unreadable synth.json; pass a new folder") from None
    want = {"arch": arch, "layers": layers, "scale": scale}
    have = {k: made.get(k) for k in want}
    if have != want:
        raise RecipeError(
            f"--model-out {path} holds a synthetic model of another shape ({have}, asked {want}); pass a new folder"
        )


def set_aside(run_dir: Path, keep: tuple[str, ...] = RESUME_KEEP) -> Path | None:
    """Move an earlier attempt's log and measurements to run_dir/attempt-N/ (checkpoints and the
    config stay, so verl resumes; `keep=()` moves them too); returns the folder, or None when there
    was nothing to move."""
    moving = [p for p in run_dir.iterdir() if p.name not in keep and not p.name.startswith("attempt-")]
    if not moving:
        return None
    n = 1 + sum(1 for p in run_dir.glob("attempt-*") if p.is_dir())
    dest = run_dir / f"attempt-{n}"
    dest.mkdir()
    for p in moving:
        p.rename(dest / p.name)
    return dest


# --- the run folder while a launcher works in it ---------------------------------------------
# `train` claims its run folder for as long as it runs (a second launch into it gets one line
# naming the first) and marks it incomplete until it has finished writing it. A folder so marked
# was stopped (Ctrl-C, a kill, a crash of the launcher): it never blocks a retry. The same
# `--run-dir` again moves the stopped attempt whole to attempt-N/ and starts over; --resume
# continues it where it has checkpoints. A command without --run-dir makes a new folder each time.


def retry_note(run_dir: Path, named: bool) -> str:
    """What a stopped run folder is left as, and what each way on does, true for this invocation:
    the same command starts over in this folder only when it named it (`named`); --resume is
    offered only where verl wrote checkpoints to continue from."""
    over = "this attempt moves to attempt-N/"
    text = (
        f"marked incomplete: the same command starts it over ({over})"
        if named
        else f"marked incomplete: the same command makes a new folder; --run-dir {run_dir} starts this one "
        f"over ({over})"
    )
    ckpt = run_dir / rundir.CHECKPOINTS
    if ckpt.is_dir() and any(ckpt.iterdir()):
        text += f", --resume --run-dir {run_dir} continues it from its checkpoints"
    return text


def is_incomplete(run_dir: Path) -> bool:
    return (run_dir / rundir.INCOMPLETE).is_file()


def claim_run_dir(path: Path, resume: bool) -> bool:
    """`check_run_dir` under a claim this process holds until it exits; returns True to resume.

    Of two launches into one folder exactly one proceeds; the other gets one line naming it. A
    folder a stopped launch left marked incomplete is set aside whole (attempt-N/) unless
    `resume`, so the retry starts in a fresh folder of the same name.
    """
    inflight.claim(path, "the run folder")
    if path.is_dir() and is_incomplete(path) and not resume:
        aside = set_aside(path, keep=())
        print(f"--run-dir {path}: an earlier attempt was stopped before it finished; it is kept in {aside}")
        return False
    return check_run_dir(path, resume)


def mark_incomplete(run_dir: Path, named: bool = True) -> None:
    """Create the run folder (if new) and mark it incomplete until `mark_complete`; `named`: the
    command line named it (--run-dir), so the same command comes back to it (`retry_note`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"pid": os.getpid(), "command": inflight.this_command(), "since": time.time()}
    inflight.write_text(run_dir / rundir.INCOMPLETE, json.dumps(info) + "\n", "the run folder's marker")
    inflight.keep_note(run_dir, lambda: retry_note(run_dir, named))


def new_run_dir(base: Path, name: str) -> Path:
    """A run folder no other command has: `base/name`, else `base/name-2`, `-3`, ... (the rule's
    `-<k>`). Each is made with one mkdir, which exactly one of two commands started in the same
    second wins; the other takes the next. Removed again at exit if nothing was written into it."""
    base.mkdir(parents=True, exist_ok=True)
    k = 1
    while True:
        path = (base / (name if k == 1 else f"{name}-{k}")).resolve()
        try:
            path.mkdir()
        except FileExistsError:
            k += 1
            continue
        atexit.register(_drop_if_empty, path)
        return path


def _drop_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def mark_complete(run_dir: Path) -> None:
    """The launcher has written everything it writes into the folder (a failed run included)."""
    (run_dir / rundir.INCOMPLETE).unlink(missing_ok=True)
    inflight.keep_note(run_dir, None)
