"""Transformer backbones of keras_hub (BERT, GPT-2, the T5 encoder-decoder), built from a small
config with random weights and fitted under a classification head (keras_hub_models.py), on
SALUS and on TensorFlow's CPU: the same losses (1e-4 relative), evaluation, predictions and
weights (1e-3), every captured step run in the daemon. They exercise Embedding, positional
embeddings, MultiHeadAttention-style einsums with padding and causal masks, LayerNormalization,
GELU, T5's relative position buckets and RMS normalisation, and their gradients.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

pytest.importorskip("keras_hub")

# The adaptor tests' daemon, runner and tolerances (losses 1e-4, weights 1e-3).
from test_tensorflow_adaptor import (  # noqa: E402
    LOSS_RTOL,
    Daemon,
    assert_matches,
    daemon,  # noqa: F401  (the module's daemon fixture)
    run,
)


@pytest.mark.parametrize("model", ["bert", "gpt2", "t5"])
def test_keras_hub_backbone_trains_on_salus_like_on_the_cpu(daemon: Daemon, model: str,  # noqa: F811
                                                            tmp_path: Path) -> None:
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    salus = run("keras_hub_models.py", model, endpoint=daemon.endpoint,
                env_extra={"SALUS_TF_DUMP_DIR": str(graphs)})
    cpu = run("keras_hub_models.py", model, endpoint=None)
    assert "SALUS" in salus["devices"] and "SALUS" not in cpu["devices"]
    # Train (full and short last batch), evaluate and predict: each a daemon session.
    assert len(list(graphs.glob("*.pb"))) >= 4
    assert_matches(salus, cpu)
    np.testing.assert_allclose(salus["evaluate"], cpu["evaluate"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(salus["predict"], cpu["predict"], atol=1e-4)
