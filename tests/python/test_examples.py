"""Every program in examples/ runs against a real daemon at a tiny size and does what it says:
the ONNX client trains and serves, the C++ client trains, the Kubernetes job trains LeNet-5 (and
its pod validates), the Keras script fits on the SALUS device, the PyTorch loop runs on the
`salus` device and the captured step trains. The TensorFlow and PyTorch ones run in their own
environments (.venv-tf, .venv-torch) and are skipped where those are absent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from salus_daemon import Daemon  # noqa: E402
from test_deploy import KUBERNETES_VERSIONS, validation_errors  # noqa: E402

MODELS = REPO / "benchmarks" / "models"


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(memory="2GiB", policy="fair")
    yield d
    d.stop()


def run(daemon: Daemon, *cmd: str, timeout: float = 600) -> str:
    env = dict(os.environ, SALUS_ENDPOINT=daemon.endpoint, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO / "adaptors" / "python"))
    env.pop("SALUS_TF_DISABLE", None)
    r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss (-?[\d.]+)", out)]


def test_onnx_client_trains_and_serves(daemon: Daemon) -> None:
    out = run(daemon, sys.executable, str(EXAMPLES / "onnx_client.py"), "--steps", "60")
    assert "salus-server" in out
    accuracy = float(re.search(r"accuracy of the served model: ([\d.]+)", out).group(1))
    assert accuracy > 0.5  # ten classes: chance is 0.1
    assert losses(out)[-1] < losses(out)[0]


def test_cpp_client_trains(daemon: Daemon) -> None:
    out = run(daemon, str(REPO / "build" / "bin" / "salus-example-train-onnx"),
              str(MODELS / "mlp.onnx"), "30")
    assert losses(out)[-1] < losses(out)[0]


def test_kubernetes_job_trains_lenet5(daemon: Daemon) -> None:
    out = run(daemon, sys.executable, str(EXAMPLES / "kubernetes" / "train_lenet5.py"),
              str(MODELS / "lenet5.onnx"), "40")
    first, last = map(float, re.search(r"done: loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first


def test_kubernetes_pod_validates_and_runs_the_job() -> None:
    objects = [d for d in yaml.safe_load_all((EXAMPLES / "kubernetes" / "train-pod.yaml")
                                             .read_text()) if d]
    for version in KUBERNETES_VERSIONS:
        assert validation_errors(objects, version) == []
    (pod,) = objects
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["salus.ai/gpu-memory"] == 8
    assert container["command"][1] == "/models/train_lenet5.py"
    assert container["command"][2] == "/models/lenet5.onnx"


def venv_python(name: str) -> Path:
    python = REPO / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{name} is not set up")
    return python


def test_keras_script_fits_on_salus(daemon: Daemon) -> None:
    python = venv_python(".venv-tf")
    if not (REPO / "build" / "adaptors" / "tensorflow" / "package").is_dir():
        pytest.skip("the TensorFlow adaptor is not built")
    out = run(daemon, str(python), str(EXAMPLES / "keras_fit.py"), "--epochs", "2",
              "--samples", "256")
    assert "SALUS" in out.splitlines()[0]
    assert "evaluate: loss" in out


def test_pytorch_device_loop_trains(daemon: Daemon) -> None:
    out = run(daemon, str(venv_python(".venv-torch")), str(EXAMPLES / "pytorch_device.py"),
              "--steps", "30")
    assert losses(out)[-1] < losses(out)[0]
    assert "trained:" in out


def test_pytorch_captured_step_trains(daemon: Daemon) -> None:
    out = run(daemon, str(venv_python(".venv-torch")),
              str(EXAMPLES / "pytorch_capture_step.py"), "--steps", "30")
    assert losses(out)[-1] < losses(out)[0]
    accuracy = float(re.search(r"accuracy of the synced model, on the CPU: ([\d.]+)", out)
                     .group(1))
    assert accuracy > 0.7
