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
    # Every daemon is stopped (killed if it does not drain) even when one of them fails to.
    failed: BaseException | None = None
    for d in started:
        try:
            if d.proc.poll() is None:
                d.stop()
        except BaseException as e:
            failed = failed or e
    if failed is not None:
        raise failed


@pytest.fixture
def daemon(daemon_factory) -> Daemon:  # noqa: ANN001
    return daemon_factory()


@pytest.fixture(autouse=True)
def _omp_env() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
