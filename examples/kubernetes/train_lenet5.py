"""A training job for a pod on a SALUS node: LeNet-5 (an ONNX model) learns to tell apart ten
synthetic digit-like patterns, its iterations run by the node's salus-server within the pod's
allocation. Needs only the Salus Python client and numpy; the model is a file the pod mounts.

    python3 train_lenet5.py [MODEL] [STEPS]      (default /models/lenet5.onnx, 300)

In a pod the device plugin sets SALUS_ENDPOINT and SALUS_ALLOCATION_TOKEN; elsewhere the
client finds a local daemon as every client does.
"""

import os
import sys

import numpy as np

import salus

model = sys.argv[1] if len(sys.argv) > 1 else "/models/lenet5.onnx"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
batch = 32

rng = np.random.default_rng(0)
patterns = rng.uniform(0, 1, (10, 1, 28, 28)).astype(np.float32)
print("endpoint", os.environ.get("SALUS_ENDPOINT", salus.default_endpoint()),
      "allocation", os.environ.get("SALUS_ALLOCATION", "-"), flush=True)
with salus.connect(name="lenet5-example") as client:
    session = client.create_session(
        model=model, mode="train", inputs={"x": (batch, 1, 28, 28), "labels": (batch,)},
        loss="loss", optimizer={"type": "sgd", "lr": 0.05, "momentum": 0.9},
        iterations=steps, name="lenet5-example", admission_timeout=600)
    first = last = None
    for step in range(steps):
        labels = rng.integers(0, 10, batch)
        x = patterns[labels] + 0.3 * rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
        loss = float(session.run({"x": x, "labels": labels.astype(np.int64)},
                                 fetches=["loss"])["loss"])
        first = loss if first is None else first
        last = loss
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss:.4f}", flush=True)
    session.close()
print(f"done: loss {first:.4f} -> {last:.4f}")
