"""The salus-devices tool: it must run on any machine and say whether a GPU is usable."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


def test_json_lists_cpu_and_cuda_state(bin_dir: Path) -> None:
    out = subprocess.run(
        [str(bin_dir / "salus-devices"), "--json"], check=True, capture_output=True, text=True
    ).stdout
    info = json.loads(out)
    assert info["cpu"]["available"] is True
    assert info["cpu"]["threads"] >= 1
    cuda = info["cuda"]
    if cuda["devices"]:
        assert cuda["reason"] == ""
        assert all(d["total_bytes"] > 0 for d in cuda["devices"])
    else:
        assert cuda["reason"].startswith("no GPU")


def test_bad_flag_is_a_usage_error(bin_dir: Path) -> None:
    res = subprocess.run(
        [str(bin_dir / "salus-devices"), "--no-such-flag"], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "no-such-flag" in res.stderr


def test_asking_for_a_missing_gpu_says_so(bin_dir: Path, tmp_path: Path) -> None:
    info = json.loads(
        subprocess.run(
            [str(bin_dir / "salus-devices"), "--json"], check=True, capture_output=True, text=True
        ).stdout
    )
    if info["cuda"]["devices"]:
        pytest.skip("a GPU is present")
    models = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
    commands = [
        [str(bin_dir / "salus-server"), "--device", "cuda:0",
         "--listen", f"ipc://{tmp_path}/s.sock"],
        [str(bin_dir / "salus-run"), "--model", str(models / "mlp.onnx"), "--mode", "infer",
         "--input", "x=2,784", "--input", "labels=2", "--device", "cuda:0"],
        [str(bin_dir / "salus-conformance"), "--data", str(tmp_path), "--device", "cuda:0",
         "--report", str(tmp_path / "r.json")],
    ]
    for cmd in commands:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert res.returncode != 0, cmd
        # A CUDA build without a usable GPU, or a build without the CUDA device.
        assert "no GPU" in res.stderr or "no CUDA device" in res.stderr, (cmd, res.stderr)
        assert "cuda:0" in res.stderr, (cmd, res.stderr)
