"""keras.applications architectures as a new user trains them (benchmarks/tensorflow/zoo.py's
script: weights=None, preprocess_input, default Adam, model.fit with a last short batch,
evaluate, predict) on SALUS and on TensorFlow's CPU. The subset covers the ops the zoo added
beyond the hand-written models of test_tensorflow_adaptor.py: depthwise convolutions and their
gradients, Relu6, hard swish, Pad, squeeze-and-excitation (MobileNetV3Small); AvgPool and its
gradient, ConcatOffset, a deep concatenating network (DenseNet121).

What must agree: the untrained model's evaluation (the forward pass, to 1e-5), the trained
losses and the predictions. Training losses are compared loosely (5e-2 relative; TensorFlow's
own two CPU kernel sets differ by 2.9e-2 on DenseNet121, the zoo's spread column): a ReLU whose
input rounds to either side of zero routes a gradient differently, and Adam's first steps, which
move each weight by about its learning rate whatever the gradient's size, carry that into the
weights; TensorFlow's own two CPU kernels (oneDNN, Eigen) drift apart the same way (the zoo's
spread column). A wrong op shows from the first step, well beyond that.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "benchmarks" / "tensorflow"))

import zoo  # noqa: E402
from salus_daemon import Daemon  # noqa: E402

TRAINED_LOSS_RTOL = 5e-2


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(memory="4GiB", policy="fair")
    yield d
    d.stop()


@pytest.mark.parametrize("name", zoo.SUBSETS["ci"])
def test_keras_application_trains_on_salus_like_on_the_cpu(daemon: Daemon, name: str,
                                                           tmp_path: Path) -> None:
    salus = zoo.run_child(name, tmp_path, daemon.endpoint, timeout=900)
    cpu = zoo.run_child(name, tmp_path, None, timeout=900)
    assert cpu["error"] is None, cpu["error"]
    assert salus["error"] is None, salus["error"]
    assert "SALUS" in salus["devices"]
    # Every captured step ran in the daemon: training (full and last short batch), evaluate
    # and predict sessions, none refused.
    assert len(list((tmp_path / f"{name}-graphs").glob("*.pb"))) >= 4
    np.testing.assert_allclose(salus["initial"], cpu["initial"], rtol=1e-5)
    np.testing.assert_allclose(salus["loss"], cpu["loss"], rtol=TRAINED_LOSS_RTOL)
    np.testing.assert_allclose(salus["evaluate"], cpu["evaluate"], rtol=TRAINED_LOSS_RTOL)
    np.testing.assert_allclose(salus["predict"], cpu["predict"], atol=2e-2)
    row = zoo.compare(name, salus, cpu, tmp_path, None)
    assert row["ops"] > 20
