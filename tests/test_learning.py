"""verl_recipes.measure.learning: a run's reward curve from verl's own metrics file, the rise
against the headroom that tells learning from a flat control, and the curve written as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.measure.learning import read_curve, write_curves


def _run(tmp_path: Path, name: str, rewards: list[float]) -> Path:
    run = tmp_path / name
    run.mkdir()
    rows = [{"step": i + 1, "data": {"critic/score/mean": r, "timing_s/step": 4.0}} for i, r in enumerate(rewards)]
    (run / "verl_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_rise_of_half_the_headroom_is_learning_and_a_flat_control_is_not(tmp_path: Path) -> None:
    up = read_curve(_run(tmp_path, "up", [0.01, 0.02, 0.03, 0.2, 0.5, 0.6, 0.62, 0.64]), "learning")
    assert up.start == pytest.approx(0.02) and up.end == pytest.approx(0.62)
    assert up.rise == pytest.approx(0.6 / 0.98) and up.learned() and not up.flat()
    short = read_curve(_run(tmp_path, "short", [0.01, 0.02, 0.03, 0.2, 0.3, 0.4, 0.45, 0.47]), "learning")
    assert not short.learned()  # 0.42 of 0.98: under half
    flat = read_curve(_run(tmp_path, "flat", [0.004, 0.006, 0.005, 0.004, 0.006, 0.005]), "control")
    assert flat.flat() and not flat.learned()
    write_curves([up, flat], tmp_path / "learning-curve")
    assert (tmp_path / "learning-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "learning-curve.json").read_text())
    assert doc["learning"]["rewards"][-1] == 0.64 and doc["control"]["rise_of_headroom"] == 0.0


def test_a_curve_with_a_missing_step_or_too_few_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path, "gap", [0.1] * 8)
    lines = (run / "verl_metrics.jsonl").read_text().splitlines()
    (run / "verl_metrics.jsonl").write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    with pytest.raises(RecipeError, match="none missing"):
        read_curve(run, "x")
    with pytest.raises(RecipeError, match="N >= 6"):
        read_curve(_run(tmp_path, "few", [0.1] * 5), "x")
    with pytest.raises(RecipeError, match=r"no verl_metrics\.jsonl"):
        read_curve(tmp_path, "x")
