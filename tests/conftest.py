"""Shared test set-up: the checkout root, and skipping `gpu` tests on hosts without a GPU."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from verl_recipes import has_gpu

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("VERL_RECIPES_ROOT", str(ROOT))


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
