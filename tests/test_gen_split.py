"""Where verl's gen phase goes: the wrappers (worker.gen_split) and the per-step split (measure.gen_split)."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from pathlib import Path

import pytest
from verl_recipes import rundir
from verl_recipes.measure import gen_split as measure
from verl_recipes.worker import gen_split


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(rundir.RUN_DIR_ENV, str(tmp_path))
    return tmp_path


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.GEN_SPLIT).read_text().splitlines()]


def test_a_coroutine_method_stays_one_and_is_timed_until_it_returns(run_dir: Path) -> None:
    class Server:
        async def generate(self, x: int) -> int:
            await asyncio.sleep(0.05)
            return x + 1

    Server.generate = gen_split.timed_method(Server.generate, "request")  # type: ignore[method-assign]
    assert inspect.iscoroutinefunction(Server.generate)  # Ray decides actor concurrency from this
    assert asyncio.run(Server().generate(1)) == 2
    (rec,) = _records(run_dir)
    assert rec["name"] == "request" and rec["ok"] and rec["t1"] - rec["t0"] >= 0.05


def test_verls_auto_await_is_timed_whether_called_or_awaited(run_dir: Path) -> None:
    from verl.utils.ray_utils import auto_await

    class Manager:
        @auto_await
        async def sleep_replicas(self) -> str:
            await asyncio.sleep(0.05)
            return "asleep"

    Manager.sleep_replicas = gen_split.timed_method(Manager.sleep_replicas, "sleep")  # type: ignore[method-assign]
    assert Manager().sleep_replicas() == "asleep"  # the driver's call: no running loop

    async def from_a_loop() -> str:
        return await Manager().sleep_replicas()

    assert asyncio.run(from_a_loop()) == "asleep"
    recs = _records(run_dir)
    assert [r["name"] for r in recs] == ["sleep", "sleep"]
    assert all(r["ok"] and r["t1"] - r["t0"] >= 0.05 for r in recs)


def test_a_failed_call_is_recorded_and_raises(run_dir: Path) -> None:
    def boom() -> None:
        raise ValueError("no server")

    with pytest.raises(ValueError):
        gen_split.timed(boom, "manager")()
    (rec,) = _records(run_dir)
    assert rec["ok"] is False


def test_targets_name_verls_own_classes_and_methods() -> None:
    """The wrapped names exist in verl 0.9.1's source (read, not imported: the agent loop needs vLLM)."""
    import importlib.util

    for module, targets in gen_split.TARGETS.items():
        spec = importlib.util.find_spec(module.rpartition(".")[0])
        assert spec is not None and spec.submodule_search_locations
        src = (Path(next(iter(spec.submodule_search_locations))) / (module.rpartition(".")[2] + ".py")).read_text()
        for cls, method, _ in targets:
            body = re.split(rf"\nclass {cls}\b[(:]", src, maxsplit=1)[1].split("\nclass ", 1)[0]
            assert f"def {method}(" in body, (module, cls, method)


def test_split_cuts_each_gen_window_at_its_records() -> None:
    phases = [
        {"t": 100.0, "event": "begin", "name": "gen", "step": 2},
        {"t": 104.0, "event": "end", "name": "gen", "step": 2},
        {"t": 110.0, "event": "begin", "name": "gen", "step": 3},  # no request inside: left out
        {"t": 111.0, "event": "end", "name": "gen", "step": 3},
    ]
    records = [
        {"t0": 100.1, "t1": 103.5, "name": "manager"},
        {"t0": 100.2, "t1": 103.4, "name": "worker"},
        {"t0": 100.5, "t1": 103.0, "name": "request"},
        {"t0": 100.6, "t1": 103.1, "name": "request"},
        {"t0": 103.5, "t1": 103.8, "name": "sleep"},
        {"t0": 110.1, "t1": 110.9, "name": "manager"},
    ]
    from verl_recipes.measure.report import load_intervals

    windows = [(iv.step, iv.begin, iv.end) for iv in load_intervals(phases, 120.0) if iv.name == "gen"]
    (row,) = measure.split(windows, records)
    assert row.step == 2 and row.requests == 2
    assert row.to_first_request == pytest.approx(0.5)
    assert row.vllm == pytest.approx(2.6)
    assert row.after_last_answer == pytest.approx(0.4)
    assert row.sleep == pytest.approx(0.3)
    parts = sum(getattr(row, p) for p in measure.PARTS)
    assert parts == pytest.approx(row.gen_s) and row.rest == pytest.approx(0.2)
    table = measure.markdown(measure.to_json([row]))
    assert table[0].startswith("| step | gen s | requests | to first request") and "| 2 | 4.00 | 2 | 0.50 |" in table[2]
