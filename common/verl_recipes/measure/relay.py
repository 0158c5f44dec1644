"""The run's output, copied to train.log, and a run whose vLLM failed ended when verl does not end it.

verl 0.9.1 runs vLLM's engine in its own processes and talks to its workers through
`collective_rpc` (the weight sync, the adapter, sleep and wake). When a worker's call fails, vLLM
logs it (`WorkerProc hit an exception`, then `Worker failed with error ...` from the engine core)
and returns the error to the caller, but verl's weight sender is by then streaming buckets to
the receiver that died and waits for it without a timeout: the Qwen2.5-3B LoRA rank whose adapter
vLLM refused (validation/verl-examples/results/grpo-qwen2-5-3b-gsm8k-grpo-lora/failed/
h100x1-grpo-rank0of2) sat 212 s until its campaign's limit ended it. Where vLLM fails at start
instead (the Qwen2-7B rank's profile run), verl raises and exits within seconds.

So the first of vLLM's failure lines starts a clock: a run still going `VLLM_GRACE_S` later is
stopped (SIGTERM to the monitor, which forwards it to verl and ends the tree, so the run's summary
and report are written as for any stopped run), with one line in train.log that says so. None of
the committed runs that ended well prints any of these lines (86 train logs, 2026-12-07); the two
that do are the failures above. The report's ending still names vLLM's own error as the cause.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from typing import BinaryIO

#: vLLM's lines for a call of verl's that failed in a worker, or an engine core that died
VLLM_FAILED = re.compile(
    rb"WorkerProc hit an exception|Invocation of collective_rpc method failed|Worker failed with error|"
    rb"EngineCore encountered a fatal error|EngineDeadError"
)
#: how long verl has to end a run itself after vLLM's first failure line (it raises within seconds
#: when it can; its weight sender never does)
VLLM_GRACE_S = 120.0


def relay(proc: subprocess.Popen[bytes], log: BinaryIO, echo: bool, grace_s: float = VLLM_GRACE_S) -> int:
    """Copy `proc`'s output to `log` (and to this terminal when `echo`) until it exits; return its
    exit code. After a line of `VLLM_FAILED`, a `proc` still running `grace_s` later gets SIGTERM."""
    assert proc.stdout is not None
    lock = threading.Lock()
    timer: threading.Timer | None = None

    def write(data: bytes) -> None:
        with lock:
            log.write(data)
            log.flush()
            if echo:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()

    def stop(first: int) -> None:
        if proc.poll() is not None:
            return
        write(stop_line(grace_s, first).encode())
        proc.terminate()

    try:
        for n, line in enumerate(proc.stdout, start=1):
            write(line)
            if timer is None and VLLM_FAILED.search(line):
                timer = threading.Timer(grace_s, stop, args=(n,))
                timer.daemon = True
                timer.start()
        return proc.wait()
    finally:
        if timer is not None:
            timer.cancel()


def stop_line(grace_s: float, first: int) -> str:
    """What train.log says of a stopped run: not an error line itself (`ending.last_error` keeps
    naming vLLM's), and pointing at vLLM's first failure line by its number in the log."""
    return (
        f"verl-recipes: vLLM failed {grace_s:.0f} s ago (line {first} of this log) and verl has not ended "
        "the run; stopping it (kill -TERM to the monitor, which passes it on to verl)\n"
    )
