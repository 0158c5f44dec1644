"""`verl-recipes trace` on a real torch profiler trace made here (CPU operators; a GPU trace adds
kernel events, which the same code sums first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from verl_recipes.measure import trace


def _trace(tmp_path: Path) -> Path:
    out = tmp_path / "t.json"
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            c = a @ b
            torch.log_softmax(c, dim=-1)
    prof.export_chrome_trace(str(out))
    return out


def test_a_matmul_loop_is_mostly_matrix_multiply(tmp_path: Path) -> None:
    s = trace.summarize(trace.load_events(_trace(tmp_path)))
    assert s["kind"] == "CPU operators" and s["events"] > 0
    fams = s["families_ms"]
    assert "matrix multiply" in fams and "softmax / cross-entropy / log-probs" in fams
    assert any(t["name"] == "aten::mm" and t["calls"] == 20 for t in s["top"])
    assert s["busy_ms"] >= max(fams.values())


def test_cli_refuses_a_non_trace_and_never_overwrites(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    cmd = [sys.executable, "-m", "verl_recipes.cli", "trace"]
    r = subprocess.run([*cmd, str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "traceEvents" not in r.stdout
    t = _trace(tmp_path)
    out = tmp_path / "table.md"
    assert subprocess.run([*cmd, str(t), "--out", str(out)], capture_output=True).returncode == 0
    assert "matrix multiply" in out.read_text()
    r = subprocess.run([*cmd, str(t), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "exists" in r.stderr
