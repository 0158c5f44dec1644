"""Shared test set-up: the checkout root, Ctrl-C as a terminal delivers it, and skipping `gpu` tests
on hosts without a GPU."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
from verl_recipes import has_gpu

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("VERL_RECIPES_ROOT", str(ROOT))

# The interrupt tests send SIGINT to a command's process group as a terminal's Ctrl-C does. A shell
# starts a background job (`nohup pytest ... &`) with SIGINT ignored, and an ignored signal stays
# ignored across exec: every command the tests start would then never see the interrupt and run to
# its end. A handler (not an ignore) is reset by exec, so each command starts as one typed at a
# terminal would.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: run `pytest -m gpu` on the GPU host (gpu/README.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def pypi() -> None:
    """Skip a test that downloads from PyPI when pypi.org cannot be reached (checked once a session)."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        pytest.skip("needs PyPI to resolve and download (pypi.org:443 unreachable)")
