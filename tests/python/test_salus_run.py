"""salus-run: compiles a reference model in-process and times its iterations."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MLP = REPO / "benchmarks" / "models" / "mlp.onnx"


def run(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "salus-run"), *args], capture_output=True, text=True,
                          timeout=120)


def test_times_training_iterations(bin_dir: Path) -> None:
    res = run(bin_dir, "--model", str(MLP), "--input", "x=8,784", "--input", "labels=8",
              "--iterations", "3", "--warmup", "1")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["mode"] == "train" and out["iterations"] == 3
    # mlp 784-512-512-10: 669,706 float32 parameters, plus nothing for plain SGD.
    assert out["persistent_bytes"] >= 669_706 * 4
    assert out["ephemeral_bytes"] > 0
    assert 0 < out["min_ms"] <= out["median_ms"] <= out["max_ms"]


def test_inference_needs_no_labels_or_loss(bin_dir: Path) -> None:
    train = json.loads(run(bin_dir, "--model", str(MLP), "--input", "x=8,784", "--input",
                           "labels=8", "--iterations", "1").stdout)
    res = run(bin_dir, "--model", str(MLP), "--mode", "infer", "--input", "x=8,784",
              "--input", "labels=8", "--iterations", "1")
    assert res.returncode == 0, res.stderr
    infer = json.loads(res.stdout)
    # No gradients in inference: less scratch memory than a training step.
    assert infer["ephemeral_bytes"] < train["ephemeral_bytes"]


def test_bad_arguments_are_reported(bin_dir: Path) -> None:
    res = run(bin_dir, "--model", str(MLP), "--input", "x=8,zero")
    assert res.returncode == 1 and "bad dimension 'zero'" in res.stderr
    res = run(bin_dir, "--model", str(MLP), "--mode", "tune")
    assert res.returncode == 1 and "--mode" in res.stderr
    res = run(bin_dir, "--model", "/nonexistent.onnx")
    assert res.returncode == 1 and "cannot read" in res.stderr
    res = run(bin_dir, "--no-such-flag")
    assert res.returncode == 2


def test_runs_a_model_written_by_the_environments_onnx(bin_dir: Path, tmp_path: Path) -> None:
    """onnx.helper.make_model writes the newest IR version the package knows (10 for 1.16)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Gelu", ["h"], ["y"]),
         helper.make_node("ReduceMean", ["y", "axes"], ["m"], keepdims=0)],
        "current",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N"])],
        [w, numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert model.ir_version >= 10
    path = tmp_path / "current.onnx"
    onnx.save(model, path)
    res = run(bin_dir, "--model", str(path), "--mode", "infer", "--input", "x=2,4",
              "--iterations", "1")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["mode"] == "infer"
