"""The user's folders (`verl_recipes.workload.userpaths`): real parquet files and checkpoint folders, each
refused in one line that says what is missing and how to make it, and never written into."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.workload.arch import ARCHS_DIR
from verl_recipes.workload.dataset import make_row
from verl_recipes.workload.userpaths import (
    check_data_dir,
    check_model_dir,
    check_model_out,
    check_parquet,
    check_run_dir,
    set_aside,
)


def _err(fn: object, *args: object) -> str:
    with pytest.raises(RecipeError) as e:
        fn(*args)  # type: ignore[operator]
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _rows(n: int) -> list[dict[str, object]]:
    return [make_row(f"q{i}?", f"s{i}", i, "train", i) for i in range(n)]


def test_the_embedded_layout_passes_and_each_gap_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pd.DataFrame(_rows(8)).to_parquet(good, index=False)
    check_parquet(good, "prompt", 8, "--data")
    assert "8 row(s), fewer than data.train_batch_size=16" in _err(check_parquet, good, "prompt", 16, "--data")
    assert "no column question (data.prompt_key" in _err(check_parquet, good, "question", 1, "--data")

    text = tmp_path / "text.parquet"
    pd.DataFrame([{**r, "prompt": "a plain string"} for r in _rows(2)]).to_parquet(text, index=False)
    assert "string, not chat messages" in _err(check_parquet, text, "prompt", 1, "--data")

    no_gt = tmp_path / "no_gt.parquet"
    pd.DataFrame([{**r, "reward_model": {"style": "rule"}} for r in _rows(2)]).to_parquet(no_gt, index=False)
    assert "without the ground_truth" in _err(check_parquet, no_gt, "prompt", 1, "--data")

    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert "not a parquet file" in _err(check_parquet, junk, "prompt", 1, "--data")


def test_a_data_folder_is_a_folder(tmp_path: Path) -> None:
    assert "no such folder" in _err(check_data_dir, tmp_path / "nope")
    check_data_dir(tmp_path)  # its files are checked as the composed config names them


def test_a_checkpoint_folder_needs_config_tokenizer_and_every_shard(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((ARCHS_DIR / "llama-2-7b" / "config.json").read_text())
    msg = _err(check_model_dir, tmp_path)
    assert "no tokenizer" in msg and "no weights" in msg and "verl-recipes synth-model --arch" in msg
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    msg = _err(check_model_dir, tmp_path)
    assert "no tokenizer" not in msg and "no model-00002-of-00002.safetensors (of 2 shards" in msg
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert check_model_dir(tmp_path)["model_type"] == "llama"
    (tmp_path / "config.json").write_text("{")
    assert "not valid JSON" in _err(check_model_dir, tmp_path)


def test_run_folders_are_new_empty_or_resumed(tmp_path: Path) -> None:
    assert check_run_dir(tmp_path / "new", resume=False) is False
    assert check_run_dir(tmp_path, resume=False) is False  # empty
    assert "does not exist, so there is no run to continue" in _err(check_run_dir, tmp_path / "new", True)
    assert "is empty, so there is no run to continue" in _err(check_run_dir, tmp_path, True)
    (tmp_path / "verl_config.yaml").write_text("a: 1\n")
    (tmp_path / "train.log").write_text("attempt 1\n")
    (tmp_path / "checkpoints").mkdir()
    assert "holds a run already (verl_config.yaml, train.log)" in _err(check_run_dir, tmp_path, False)
    assert check_run_dir(tmp_path, resume=True) is True
    aside = set_aside(tmp_path)
    assert aside == tmp_path / "attempt-1" and (aside / "train.log").read_text() == "attempt 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt-1", "checkpoints", "verl_config.yaml"]
    (tmp_path / "train.log").write_text("attempt 2\n")
    assert set_aside(tmp_path) == tmp_path / "attempt-2"


def test_model_out_reuses_only_its_own_shape(tmp_path: Path) -> None:
    check_model_out(tmp_path / "new", "llama-2-7b", 2, "tiny")
    (tmp_path / "synth.json").write_text(json.dumps({"arch": "llama-2-7b", "layers": 2, "scale": "tiny"}))
    check_model_out(tmp_path, "llama-2-7b", 2, "tiny")
    assert "another shape" in _err(check_model_out, tmp_path, "llama-2-7b", 32, "full-width")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    assert "holds no synthetic model" in _err(check_model_out, mine, "llama-2-7b", 2, "tiny")


def test_the_dataset_command_never_replaces_someone_elses_parquet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pd.DataFrame(_rows(3)).to_parquet(tmp_path / "train.parquet", index=False)
    before = (tmp_path / "train.parquet").read_bytes()
    assert main(["dataset", "--out", str(tmp_path), "--train", "8", "--test", "2"]) == 2
    assert "train.parquet that this command did not write" in capsys.readouterr().err
    assert (tmp_path / "train.parquet").read_bytes() == before
    ours = tmp_path / "ours"
    assert main(["dataset", "--out", str(ours), "--train", "8", "--test", "2"]) == 0
    assert main(["dataset", "--out", str(ours), "--train", "9", "--test", "2"]) == 0  # its own output: rewritten
    assert len(pd.read_parquet(ours / "train.parquet")) == 9
