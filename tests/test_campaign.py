"""gpu/campaign.sh: plan lines, `requires` (passed / `!failed`), pytest lines, and the status file.

Runs the real script with the real `verl-recipes` on this host; the runs it starts fail fast on
purpose (an unknown recipe), which is what the bisection lines react to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_campaign_plan_semantics(root: Path, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# comment line\n"
        "bad|60|-|no-such-recipe --steps 1\n"
        "after-pass|60|bad|7b-lora --steps 1\n"
        "after-fail|120|!bad|pytest --collect-only -q tests/test_reap.py\n"
        "never|60|!after-fail-missing|7b-lora\n"
        "script|60|-|bash recipes/verl-vs-deepspeed/run-both.sh not-a-count\n"
    )
    out = tmp_path / "lane"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "gpu/campaign.sh", str(plan), str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in (out / "status.tsv").read_text().splitlines()]
    status = {r[0]: r[1] for r in rows}
    assert status["bad"] == "2"  # one-line error from verl-recipes train, exit 2
    assert status["after-pass"] == "skipped"
    # pytest -m gpu deselects every test of the file: exit 5 ("no tests collected"), and it did run
    assert status["after-fail"] == "5"
    assert (out / "runs" / "after-fail" / "pytest.log").is_file()
    assert status["never"] == "skipped"
    # `bash SCRIPT ARGS` gets the run folder first: run-both.sh OUT NPROC refuses NPROC "not-a-count"
    assert status["script"] == "2"
    assert "NPROC must be a positive number" in (out / "runs" / "script" / "script.log").read_text()
    assert (out / "DONE").is_file()
