"""verl's `gen` phase split into its parts, per step, from the records `worker.gen_split` writes.

Each step's `gen` window (the report's `gen` intervals from phases.jsonl) is cut at the records that fall inside it:
- ``to_first_request``: from `gen`'s start to the first sequence reaching the vLLM server (the
  driver's hand-off, the agent-loop workers' dispatch, prompt handling);
- ``vllm``: first request in to last answer out, the vLLM server's share (the span `rollout-bench`
  compares with vLLM alone);
- ``after_last_answer``: last answer out to the replicas being put to sleep (answers into
  TransferQueue, reward, and the trainer's polling noticing them: verl 0.9.1 looks every 2 s);
- ``sleep``: the replicas put to sleep;
- ``rest``: what is left of `gen` after the sleep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PARTS = ("to_first_request", "vllm", "after_last_answer", "sleep", "rest")


@dataclass(frozen=True)
class GenSplit:
    """One step's `gen` in seconds; the parts add up to `gen_s`."""

    step: int
    gen_s: float
    requests: int
    to_first_request: float
    vllm: float
    after_last_answer: float
    sleep: float
    rest: float


def split(windows: list[tuple[int, float, float]], records: list[dict[str, Any]]) -> list[GenSplit]:
    """Each `gen` window (step, begin, end: the report's closed `gen` intervals) with its parts; a
    window with no request inside is left out."""
    out = []
    for step, g0, g1 in windows:
        inside = [r for r in records if g0 <= float(r.get("t0", -1)) and float(r.get("t1", 1e30)) <= g1]
        reqs = [r for r in inside if r.get("name") == "request"]
        if not reqs:
            continue
        sleeps = [r for r in inside if r.get("name") == "sleep"]
        first_in = min(float(r["t0"]) for r in reqs)
        last_out = max(float(r["t1"]) for r in reqs)
        asleep_from = min((float(r["t0"]) for r in sleeps), default=g1)
        parts = {
            "to_first_request": first_in - g0,
            "vllm": last_out - first_in,
            "after_last_answer": max(0.0, asleep_from - last_out),
            "sleep": sum(float(r["t1"]) - float(r["t0"]) for r in sleeps),
        }
        parts["rest"] = max(0.0, (g1 - g0) - sum(parts.values()))
        out.append(GenSplit(step=step, gen_s=g1 - g0, requests=len(reqs), **parts))
    return out


def to_json(rows: list[GenSplit]) -> list[dict[str, Any]]:
    return [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(r).items()} for r in rows]


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The report's table: one line per step, seconds."""
    if not rows:
        return []
    head = ["step", "gen s", "requests", *(p.replace("_", " ") for p in PARTS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["step"]), f"{r['gen_s']:.2f}", str(r["requests"]), *(f"{r[p]:.2f}" for p in PARTS)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
