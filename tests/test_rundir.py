"""verl_recipes.rundir: the run folder's records, read through one typed reader each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_recipes.rundir import PROVENANCE, read_provenance

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_provenance_reads_as_the_typed_record() -> None:
    """Every provenance.json under recipes/ reads, and each field holds what the raw record holds."""
    paths = sorted(ROOT.glob(f"recipes/*/results/**/{PROVENANCE}"))
    assert len(paths) >= 20
    for path in paths:
        raw = json.loads(path.read_text())
        prov = read_provenance(path.parent)
        assert prov.raw == raw
        assert prov.variants == list(raw.get("variants") or [])
        assert prov.cap_gib == raw.get("cap_gib")
        assert prov.gpu_names == [g["name"] for g in raw["gpu"]["gpus"]]
        assert (prov.verl_fixes_off is None) == ("verl_fixes_off" not in raw)
        # verl's runs name no backend; the DeepSpeed side of verl-vs-deepspeed names its loop
        assert prov.backend == raw.get("backend") and prov.verl == (not path.parent.name.endswith("-deepspeed"))


def test_a_record_before_a_key_existed_says_so_and_a_broken_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert read_provenance(tmp_path).raw == {} and read_provenance(tmp_path).verl_fixes is None
    (tmp_path / PROVENANCE).write_text(json.dumps({"argv": ["verl-recipes", "train", "x", "--layers", "2"]}))
    prov = read_provenance(tmp_path)
    assert prov.verl_fixes_off is None and prov.argv_value("--layers") == "2" and prov.argv_value("--gpus") is None
    (tmp_path / PROVENANCE).write_text('{"argv": ["verl-recipes", "tr')  # cut short: read as none
    assert read_provenance(tmp_path).raw == {}
    assert "ends early" in capsys.readouterr().err


def test_committed_runs_keep_their_log_and_samples_gzipped() -> None:
    """The repository travels to a GPU host beside each wheelhouse piece, within one transfer's
    limit, so its size is taken from every piece: committed run folders keep their two large files,
    the trainer's log and the NVML samples, gzipped (a ninth and a tenth of the size). The readers
    (`rundir.read_log`, `rundir.read_jsonl`) take either form."""
    from verl_recipes.rundir import LOG, SAMPLES

    homes = ("recipes/*/results", "validation/verl-examples/results")  # recipes' runs, verl's examples' runs
    plain = sorted(
        str(p.relative_to(ROOT)) for h in homes for name in (LOG, SAMPLES) for p in ROOT.glob(f"{h}/**/{name}")
    )
    assert not plain, f"gzip these (gzip -9n FILE): {plain}"
    assert len(list(ROOT.glob(f"recipes/*/results/**/{LOG}.gz"))) >= 60
