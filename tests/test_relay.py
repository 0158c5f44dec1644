"""A run whose vLLM failed and whose trainer waits on it is stopped (`measure.relay`), on real
processes under the real monitor; a run that ends by itself, or never prints vLLM's failure, is
left alone; and the committed train logs say which lines are vLLM's failure."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verl_recipes import rundir
from verl_recipes.measure import ending
from verl_recipes.measure.relay import VLLM_FAILED, VLLM_GRACE_S, relay, stop_line

ROOT = Path(__file__).resolve().parents[1]
MONITOR = [sys.executable, "-m", "verl_recipes.cli", "monitor", "--out"]
# the lines the Qwen2.5-3B LoRA rank's vLLM printed when it refused the adapter (its train.log)
WORKER = "(vLLMHttpServer pid=4457) (Worker pid=4667) ERROR 12-07 13:47:42 [multiproc_executor.py:1000]"
FAILED = [
    f"{WORKER} WorkerProc hit an exception.",
    f"{WORKER} RuntimeError: The size of tensor a (5504) must match the size of tensor b (11008) at non-singleton "
    "dimension 0",
]


def _child(lines: list[str], then: str) -> list[str]:
    """A command that prints `lines` (flushed), then runs `then` (Python)."""
    code = f"import sys, time\nfor ln in {lines!r}:\n    print(ln, flush=True)\n{then}\n"
    return [sys.executable, "-c", code]


def _run(tmp_path: Path, cmd: list[str], grace_s: float) -> tuple[int, float, str]:
    run = tmp_path / "run"
    proc = subprocess.Popen([*MONITOR, str(run), "--", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    with open(tmp_path / "train.log", "wb") as log:
        rc = relay(proc, log, echo=False, grace_s=grace_s)
    return rc, time.monotonic() - t0, (tmp_path / "train.log").read_text()


def test_a_run_whose_vllm_failed_and_that_waits_is_stopped_with_its_cause(tmp_path: Path) -> None:
    """vLLM's failure, then a trainer that waits (sleeps 60 s): stopped `grace_s` later through
    the monitor (SIGTERM forwarded, exit 128 + 15), train.log saying so, and the ending naming
    vLLM's own error, not the stop."""
    rc, took, log = _run(tmp_path, _child([*FAILED, "waiting on the receiver"], "time.sleep(60)"), grace_s=2.0)
    assert rc == 143 and 2.0 <= took < 30, (rc, took)
    lines = log.splitlines()
    stop = [ln for ln in lines if ln.startswith("verl-recipes: vLLM failed 2 s ago (line ")]
    assert len(stop) == 1, log
    first = int(stop[0].split("(line ", 1)[1].split()[0])
    assert lines[first - 1] == FAILED[0], (first, lines)
    ended = ending.describe(tmp_path, rc, [], log_name="train.log")
    assert ended["signal"] == "SIGTERM" and "The size of tensor a (5504)" in (ended["last_error"] or ""), ended
    assert (tmp_path / "run" / rundir.SAMPLES).is_file()  # the monitor wrote its record


@pytest.mark.parametrize(
    ("lines", "then", "rc"),
    [
        (FAILED, "sys.exit(1)", 1),  # verl raises after vLLM's failure: its own exit, no stop
        (["step:1 - gen 52.0", "step:2 - gen 51.8"], "time.sleep(3); sys.exit(0)", 0),  # no failure line
    ],
)
def test_a_run_that_ends_by_itself_is_left_alone(tmp_path: Path, lines: list[str], then: str, rc: int) -> None:
    got, _, log = _run(tmp_path, _child(lines, then), grace_s=15.0)  # the monitor has time to end
    assert got == rc and "verl-recipes: vLLM failed" not in log
    assert [ln for ln in log.splitlines() if ln in lines] == lines


def _lines(log: Path) -> list[bytes]:
    with gzip.open(log) as f:
        return f.readlines()


def _logs() -> list[tuple[Path, bool]]:
    """(train.log.gz, whether the run ended well) of every committed run."""
    out = []
    for log in sorted(ROOT.glob("**/results/**/train.log.gz")):
        summary = log.parent / rundir.SUMMARY
        ok = bool(json.loads(summary.read_text()).get("ended", {}).get("ok")) if summary.is_file() else False
        out.append((log, ok))
    return out


def test_no_committed_run_that_ended_well_prints_vllms_failure() -> None:
    """The lines the clock starts on: none in any committed run that ended well, and in the two
    runs whose vLLM failed (the adapter it refused, the profile run it died in)."""
    logs = _logs()
    hit = {log for log, _ in logs if any(VLLM_FAILED.search(ln) for ln in _lines(log))}
    well = [log for log, ok in logs if ok]
    assert len(well) >= 50 and not hit & set(well), sorted(str(p) for p in hit & set(well))
    for run in (
        "grpo-qwen2-5-3b-gsm8k-grpo-lora/failed/h100x1-grpo-rank0of2",
        "grpo-qwen2-7b-seq-balance/failed/h100x1-grpo-rank0of8",
    ):
        assert ROOT / "validation/verl-examples/results" / run / "train.log.gz" in hit, run


def test_the_stop_line_is_not_a_failure_line_itself() -> None:
    """The line `relay` writes is not one it would start a clock on, nor the error the ending names."""
    line = stop_line(VLLM_GRACE_S, 1226)
    assert line.startswith("verl-recipes: vLLM failed 120 s ago (line 1226 of this log)")
    assert not VLLM_FAILED.search(line.encode()) and ending.last_error([line]) is None
