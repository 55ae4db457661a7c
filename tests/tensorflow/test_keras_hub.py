"""Transformer backbones of keras_hub (BERT, GPT-2, the T5 encoder-decoder), built from a small
config with random weights and fitted under a classification head (keras_hub_models.py), on
SALUS and on TensorFlow's CPU: the same losses (1e-4 relative), evaluation, predictions and
weights (1e-3), every captured step run in the daemon. They exercise Embedding, positional
embeddings, MultiHeadAttention-style einsums with padding and causal masks, LayerNormalization,
GELU, T5's relative position buckets and RMS normalisation, and their gradients.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from salus_daemon import Daemon  # noqa: E402

pytest.importorskip("keras_hub")

LOSS_RTOL = 1e-4
WEIGHT_RTOL, WEIGHT_ATOL = 1e-3, 1e-3


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(memory="2GiB", policy="fair")
    yield d
    d.stop()


def run(model: str, endpoint: str | None, dump: Path | None = None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("SALUS_TF_DISABLE", None)
    if endpoint is None:
        env["SALUS_TF_DISABLE"] = "1"
    else:
        env["SALUS_ENDPOINT"] = endpoint
    if dump is not None:
        dump.mkdir()
        env["SALUS_TF_DUMP_DIR"] = str(dump)
    proc = subprocess.run([sys.executable, str(HERE / "keras_hub_models.py"), model], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{model} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["bert", "gpt2", "t5"])
def test_keras_hub_backbone_trains_on_salus_like_on_the_cpu(daemon: Daemon, model: str,
                                                            tmp_path: Path) -> None:
    salus = run(model, daemon.endpoint, tmp_path / "graphs")
    cpu = run(model, None)
    assert "SALUS" in salus["devices"] and "SALUS" not in cpu["devices"]
    # Train (full and short last batch), evaluate and predict: each a daemon session.
    assert len(list((tmp_path / "graphs").glob("*.pb"))) >= 4
    np.testing.assert_allclose(salus["loss"], cpu["loss"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(salus["evaluate"], cpu["evaluate"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(salus["predict"], cpu["predict"], atol=1e-4)
    assert len(salus["weights"]) == len(cpu["weights"])
    for got, want in zip(salus["weights"], cpu["weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)
