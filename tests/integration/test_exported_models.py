"""Models exported from PyTorch (benchmarks/models/make_torch_models.py) in a real daemon.

- Engine alone (no framework needed): each model trains through the Python client on one fixed
  synthetic batch until its loss falls 3x.
- Against the frameworks (torch and onnxruntime, benchmarks/requirements.txt; skipped without
  them): inference matches onnxruntime on the same file, and 20 training steps from the same
  initial weights on the same batch match PyTorch's losses step for step.

Errors are relative to the reference's largest magnitude: max |engine - reference| / max
|reference| for a tensor, |engine - reference| / |reference| for a loss.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from salus_daemon import MODELS, REPO, Daemon

import salus

VOCAB = 1000
SEQ = 32
CLASSES = 10
IMAGE = (3, 32, 32)

TRAIN_MAX_STEPS = 40  # the engine-only test's bound on steps for a 3x fall of the loss
PARITY_STEPS = 20
INFER_RTOL = 1e-4
LOSS_RTOL = 1e-3


@dataclass(frozen=True)
class Case:
    input: str  # the data input's name; "labels" is the other
    tokens: bool  # the input holds token ids (int64) rather than images
    batch: int
    sgd_lr: float  # learning rates of the parity runs (Note [Parity learning rates])
    adam_lr: float


# Note [Parity learning rates]
# Two float32 trainings that differ only in rounding drift apart step after step, the faster the
# larger the steps, BatchNorm most. PyTorch in float32 against PyTorch in float64 on these
# batches, over 20 steps: ResNet-18 drifts to 2.9e-3 with SGD at lr 1e-3 and 6e-4 with Adam at
# 3e-4, MobileNetV2 to 2.8e-3 with SGD at lr 1e-2; at the rates below both stay within 1e-4,
# and the sequence models within 1e-6 at any of these rates. So a difference past LOSS_RTOL is
# the engine's, not rounding's.
CASES = {
    "resnet18": Case("x", False, 8, 1e-4, 3e-5),
    "mobilenetv2": Case("x", False, 8, 5e-4, 1e-4),
    "mobilenetv3": Case("x", False, 8, 5e-4, 1e-4),
    "transformer": Case("tokens", True, 8, 1e-2, 1e-3),
    "gpt": Case("tokens", True, 8, 1e-2, 1e-3),
    "lstm": Case("tokens", True, 8, 1e-2, 1e-3),
    "hf_gpt2": Case("tokens", True, 8, 1e-2, 1e-3),
    "hf_bert": Case("tokens", True, 8, 1e-2, 1e-3),
}
# What rebuilding a model in PyTorch needs beyond torch (make_torch_models.py).
NEEDS = {"mobilenetv3": ("torchvision",), "hf_gpt2": ("transformers",),
         "hf_bert": ("transformers",)}
OPTIMIZERS = ("sgd", "adam", "adamw")


def batch(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """One fixed batch: random inputs and labels to memorise; for the GPT, each token's
    successor (t + 1 mod vocabulary) as the next-token target; for Hugging Face's GPT-2, which
    shifts its labels itself, the tokens."""
    case = CASES[name]
    rng = np.random.default_rng(seed)
    if case.tokens:
        x = rng.integers(0, VOCAB, (case.batch, SEQ)).astype(np.int64)
    else:
        x = rng.standard_normal((case.batch, *IMAGE), dtype=np.float32)
    if name == "gpt":
        labels = (x + 1) % VOCAB
    elif name == "hf_gpt2":
        labels = x.copy()
    else:
        labels = rng.integers(0, CLASSES, case.batch)
    return {case.input: x, "labels": labels.astype(np.int64)}


def shapes(feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in feeds.items()}


@pytest.fixture(scope="module")
def client() -> Iterator[salus.Client]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    d = Daemon(memory="2GiB")
    try:
        with salus.connect(d.endpoint) as c:
            yield c
    finally:
        d.stop()


def train_session(client: salus.Client, name: str, feeds: dict[str, np.ndarray],
                  optimizer: dict) -> salus.Session:
    return client.create_session(model=MODELS / f"{name}.onnx", mode="train",
                                 inputs=shapes(feeds), loss="loss", optimizer=optimizer,
                                 name=name)


# -- engine alone -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_trains_until_the_loss_falls_3x(client: salus.Client, name: str) -> None:
    feeds = batch(name)
    s = train_session(client, name, feeds, {"type": "adam", "lr": 1e-2})
    try:
        losses = []
        for _ in range(TRAIN_MAX_STEPS):
            losses.append(float(s.run(feeds, fetches=["loss"])["loss"]))
            assert np.isfinite(losses[-1]), losses
            if losses[-1] * 3 <= losses[0]:
                break
        print(f"\n{name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
        assert losses[-1] * 3 <= losses[0], losses
    finally:
        s.close()


# -- against the frameworks -------------------------------------------------------------------


def frameworks(name: str = "") -> tuple:
    """(torch, onnxruntime, make_torch_models), or a skip naming what is missing (the
    torchvision and Hugging Face models need those libraries too, NEEDS)."""
    needed = ("torch", "onnxruntime", *NEEDS.get(name, ()))
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed "
                    "(pip install -r benchmarks/requirements.txt)")
    import onnxruntime
    import torch

    models_dir = str(REPO / "benchmarks" / "models")
    if models_dir not in sys.path:
        sys.path.insert(0, models_dir)
    import make_torch_models

    torch.set_num_threads(2)
    return torch, onnxruntime, make_torch_models


def rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


# Rows of the summary printed at the end of the module: (model, check, max relative diff).
REPORT: list[tuple[str, str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if REPORT:
        print("\n| model | check | max relative diff |\n| --- | --- | --- |")
        for name, check, diff in REPORT:
            print(f"| {name} | {check} | {diff:.2e} |")


@pytest.mark.parametrize("name", CASES)
def test_inference_matches_onnxruntime(client: salus.Client, name: str) -> None:
    _, ort, _ = frameworks()
    feeds = batch(name, seed=1)
    path = MODELS / f"{name}.onnx"
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(
        ["loss", "logits"], feeds)
    s = client.create_session(model=path, mode="infer", inputs=shapes(feeds), name=name)
    try:
        got = s.run(feeds, fetches=["loss", "logits"])
    finally:
        s.close()
    diffs = {k: rel_diff(got[k], w) for k, w in zip(("loss", "logits"), want, strict=True)}
    REPORT.append((name, "inference vs onnxruntime", max(diffs.values())))
    print(f"\n{name}: inference, max relative diff {diffs}")
    assert max(diffs.values()) <= INFER_RTOL, diffs


def torch_optimizer(torch, kind: str, params, lr: float):  # noqa: ANN001, ANN201
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def engine_optimizer(kind: str, lr: float) -> dict:
    if kind == "sgd":
        return {"type": "sgd", "lr": lr, "momentum": 0.9}
    opt = {"type": kind, "lr": lr, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    if kind == "adamw":
        opt["weight_decay"] = 0.01
    return opt


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("name", CASES)
def test_training_matches_pytorch(client: salus.Client, name: str, kind: str) -> None:
    torch, _, make_torch_models = frameworks(name)
    case = CASES[name]
    lr = case.sgd_lr if kind == "sgd" else case.adam_lr
    feeds = batch(name)
    try:
        s = train_session(client, name, feeds, engine_optimizer(kind, lr))
    except salus.SalusError as e:
        if kind == "adamw" and "optimizer type" in e.message:
            pytest.skip(f"the engine has no AdamW: {e.message}")
        raise
    try:
        engine = [float(s.run(feeds, fetches=["loss"])["loss"]) for _ in range(PARITY_STEPS)]
    finally:
        s.close()

    module = make_torch_models.build(name).train()
    opt = torch_optimizer(torch, kind, module.parameters(), lr)
    x, labels = (torch.from_numpy(feeds[case.input]), torch.from_numpy(feeds["labels"]))
    reference = []
    for _ in range(PARITY_STEPS):
        opt.zero_grad()
        loss, _ = module(x, labels)
        loss.backward()
        opt.step()
        reference.append(loss.item())

    diffs = np.abs(np.array(engine) - reference) / np.abs(reference)
    REPORT.append((name, f"{PARITY_STEPS} {kind} steps vs PyTorch", float(diffs.max())))
    print(f"\n{name} {kind}: loss {reference[0]:.4f} -> {reference[-1]:.4f}, max relative "
          f"diff {diffs.max():.2e} at step {int(diffs.argmax())}")
    assert diffs.max() <= LOSS_RTOL, list(zip(engine, reference, strict=True))
