"""The MLP training job most integration tests run: its session and its seeded batches, and
the code of a failing request. Plain functions, importable from tests and from job scripts
that run as their own processes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "adaptors" / "python"))

import numpy as np  # noqa: E402

import salus  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"


def create(client: salus.Client, name: str, device: str = "",
           admission_timeout: float = 0.0) -> salus.Session:
    """A training session of the MLP on batches of 16, SGD with momentum."""
    return client.create_session(model=MODELS / "mlp.onnx", mode="train",
                                 inputs={"x": (16, 784), "labels": (16,)}, loss="loss",
                                 optimizer={"type": "sgd", "lr": 0.05, "momentum": 0.9},
                                 name=name, device=device,
                                 admission_timeout=admission_timeout)


def feeds(job: int, step: int, seed: int = 1000) -> dict[str, np.ndarray]:
    """Batch `step` of job `job`: the same numbers every run (`seed` keeps files apart)."""
    rng = np.random.default_rng(seed * job + step)
    return {"x": rng.standard_normal((16, 784), dtype=np.float32),
            "labels": rng.integers(0, 10, 16).astype(np.int64)}


def code_of(fn: Callable[[], Any]) -> str:
    """The SalusError code `fn()` raises, or "OK"."""
    try:
        fn()
    except salus.SalusError as e:
        return e.code
    return "OK"
