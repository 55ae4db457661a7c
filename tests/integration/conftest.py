"""Fixtures that start a real salus-server process on loopback and stop it afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from salus_daemon import Daemon


@pytest.fixture
def daemon_factory() -> Iterator:
    started: list[Daemon] = []

    def make(*args: str, **kw: object) -> Daemon:
        d = Daemon(*args, **kw)  # type: ignore[arg-type]
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc.poll() is None:
            d.stop()


@pytest.fixture
def daemon(daemon_factory) -> Daemon:  # noqa: ANN001
    return daemon_factory()


@pytest.fixture(autouse=True)
def _omp_env() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
