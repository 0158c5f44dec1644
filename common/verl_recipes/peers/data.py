"""The workload's prompts as a peer reads them: one JSON line per prompt of the embedded dataset.

verl reads `train.parquet` of `verl-recipes dataset` (chat messages under `prompt`, the answer
under `reward_model.ground_truth`). The peers read a local JSON-lines file (`datasets`' json
builder, which both TRL's script and OpenRLHF use for a local file) with the same rows in the
same order: `prompt` (the chat messages: TRL applies the checkpoint's chat template to them),
`prompt_text` (the same messages rendered by the checkpoint's own chat template with the
assistant's turn opened, for OpenRLHF, which sends a prompt string as it is) and `ground_truth`.
The file is written by the launcher in the peer's environment, which has pyarrow and the
checkpoint's tokenizer; pyarrow and transformers load inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_recipes import inflight

#: the file name both peers read (a folder with it is TRL's `--dataset_name`)
FILE = "train.jsonl"


def rows(parquet: Path) -> list[dict[str, Any]]:
    """The dataset's rows as the peers need them: prompt messages and ground truth, in file order."""
    import pyarrow.parquet as pq

    table = pq.read_table(parquet, columns=["prompt", "reward_model"]).to_pylist()
    out = []
    for r in table:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in r["prompt"]]
        out.append({"prompt": messages, "ground_truth": str(r["reward_model"]["ground_truth"])})
    return out


def render(rows_: list[dict[str, Any]], model: Path) -> list[dict[str, Any]]:
    """Each row with `prompt_text`: its messages through the checkpoint's own chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    return [
        {**r, "prompt_text": tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)}
        for r in rows_
    ]


def write(rows_: list[dict[str, Any]], out_dir: Path) -> Path:
    """`out_dir/train.jsonl`, whole or not at all."""
    path = out_dir / FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    inflight.write_text(path, "".join(json.dumps(r) + "\n" for r in rows_), "the peers' prompts")
    return path
