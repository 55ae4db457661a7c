"""Shared fixtures: where the built binaries are."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    d = REPO / "build" / "bin"
    if not d.is_dir():
        pytest.fail(f"{d} is missing: run scripts/build first")
    return d
