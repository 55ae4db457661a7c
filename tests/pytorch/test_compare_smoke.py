"""benchmarks/pytorch/compare.py at its smallest scale: both models through a real daemon,
eager, capture_step and the lazy device, with the device's phases; the JSON it writes holds
every figure, and the figures make sense. Nothing here depends on how fast anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_compare_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pytorch" / "compare.py"), "--rounds", "1",
         "--steps", "2", "--warmup", "1", "--threads", "1", "--batch", "4", "--phases",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["batch"] == 4
    assert set(report["models"]) == {"resnet", "encoder"}
    for model, r in report["models"].items():
        assert r["samples"] == 2, model
        for key in ("eager_ms", "salus_ms", "device_ms"):
            assert r[key] > 0, (model, key)
        assert r["ratio"] == pytest.approx(r["salus_ms"] / r["eager_ms"])
        assert r["device_ratio"] == pytest.approx(r["device_ms"] / r["eager_ms"])
        phases = r["device_phases_ms"]
        assert list(phases)[:6] == ["batch to device", "zero_grad", "forward and loss",
                                    "backward", "optimizer step and flush", "loss read"]
        assert all(v >= 0 for v in phases.values()), (model, phases)
        # The step's iteration is submitted inside its flush and its reply received by the end
        # of the loss read, so the daemon's run up to the reply lies within those two phases:
        # per step, and, with two steps (a median of two is their mean), for the medians too.
        assert 0 < phases["daemon run to the reply"] <= \
            phases["optimizer step and flush"] + phases["loss read"], (model, phases)
        assert phases["daemon run of the whole step"] > 0, (model, phases)
        assert phases["recording cpu"] > 0, (model, phases)
        assert r["device_mean_ratio"] == pytest.approx(r["device_mean_ms"] / r["eager_mean_ms"])
