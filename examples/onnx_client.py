"""Train an ONNX model in salus-server through the Python client, then serve it for inference.

    python examples/onnx_client.py [--model benchmarks/models/mlp.onnx] [--steps 200]

A training session runs the model's forward, its gradients (the daemon differentiates the ONNX
graph) and SGD with momentum, one iteration per batch, with the weights staying in the daemon.
The trained weights are then read back (read_state), written into the ONNX model's
initializers, and an inference session of that model classifies the data. The daemon is the
one every client finds (SALUS_ENDPOINT, a local daemon's socket, or tcp://127.0.0.1:5501).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import salus

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "benchmarks" / "models" / "mlp.onnx"),
                   help="an ONNX classifier with inputs x [N, 784], labels [N] and outputs "
                        "loss, logits")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    # A learnable task: ten classes, each a noisy copy of its own prototype image.
    rng = np.random.default_rng(0)
    prototypes = rng.standard_normal((10, 784)).astype(np.float32)
    labels = rng.integers(0, 10, 1024)
    images = prototypes[labels] + 2.0 * rng.standard_normal((1024, 784)).astype(np.float32)

    inputs = {"x": (args.batch, 784), "labels": (args.batch,)}
    with salus.connect(name="onnx-example") as client:
        print(f"salus-server {client.server['server_version']} at {client.endpoint}")
        train = client.create_session(model=args.model, mode="train", inputs=inputs, loss="loss",
                                      optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9},
                                      name="onnx-example-train")
        for step in range(args.steps):
            at = rng.integers(0, len(images), args.batch)
            out = train.run({"x": images[at], "labels": labels[at].astype(np.int64)},
                            fetches=["loss"])
            if step % 50 == 0 or step == args.steps - 1:
                print(f"step {step:4d}  loss {float(out['loss']):.4f}")

        # The trained weights, back into the model: what a job would save as its result.
        trained = train.read_state(list(train.state_specs))
        model = onnx.load(args.model)
        copied = 0
        for init in model.graph.initializer:
            if init.name in trained:
                init.CopyFrom(numpy_helper.from_array(trained[init.name], init.name))
                copied += 1
        serve = client.create_session(model=model.SerializeToString(), mode="infer",
                                      inputs=inputs, name="onnx-example-infer")
        correct = 0
        for start in range(0, len(images) - args.batch + 1, args.batch):
            batch = slice(start, start + args.batch)
            logits = serve.run({"x": images[batch], "labels": labels[batch].astype(np.int64)},
                               fetches=["logits"])["logits"]
            correct += int((logits.argmax(axis=1) == labels[batch]).sum())
        seen = (len(images) // args.batch) * args.batch
        print(f"accuracy of the served model: {correct / seen:.3f} ({copied} weights)")
        train.close()
        serve.close()


if __name__ == "__main__":
    main()
