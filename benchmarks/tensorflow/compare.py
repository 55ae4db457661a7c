"""Per-step time of Keras training through SALUS against TensorFlow in-process on the CPU.

Runs each model twice in child processes of .venv-tf, side by side in one invocation: once on
SALUS (a salus-server this script starts, with the same number of threads) and once on
TensorFlow's CPU device (SALUS_TF_DISABLE=1). Each child fits for `--steps` steps and times every
step with a Keras callback; the first `--warmup` steps (tracing, session creation) are dropped.
Prints the medians and their ratio (SALUS / TensorFlow) and writes them as JSON.

    .venv-tf/bin/python benchmarks/tensorflow/compare.py
        [--models mlp,cnn,resnet50,mobilenetv2,mlp-loop] [--rounds 3]

resnet50 and mobilenetv2 are keras.applications' ResNet50 and MobileNetV2 (weights=None) on
32x32x3 at batch 16, with Adam. mlp-loop is the MLP trained by a custom loop instead of fit (a
tf.function with GradientTape and Adam's apply_gradients, the loss read every step).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
BATCHES = {"resnet50": 16, "mobilenetv2": 16}
SERVER = Path(os.environ.get("SALUS_SERVER", REPO / "build" / "bin" / "salus-server"))


def child(model_name: str, steps: int, warmup: int) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    batch = BATCHES.get(model_name, 64)
    if model_name in APPLICATIONS:
        # keras.applications at a small resolution, as the zoo builds them (weights=None).
        x = rng.uniform(0, 255, (batch * steps, 32, 32, 3)).astype("float32")
        model = getattr(keras.applications, APPLICATIONS[model_name])(
            weights=None, input_shape=(32, 32, 3), classes=10)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    elif model_name in ("mlp", "mlp-loop"):
        x = rng.standard_normal((batch * steps, 784)).astype("float32")
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    else:
        x = rng.standard_normal((batch * steps, 28, 28, 1)).astype("float32")
        model = keras.Sequential([keras.Input((28, 28, 1)),
                                  keras.layers.Conv2D(32, 3, activation="relu"),
                                  keras.layers.MaxPooling2D(),
                                  keras.layers.Conv2D(64, 3, activation="relu"),
                                  keras.layers.MaxPooling2D(),
                                  keras.layers.Flatten(),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    y = rng.integers(0, 10, len(x)).astype("int64")
    devices = [d.device_type for d in tf.config.list_logical_devices()]
    if model_name == "mlp-loop":
        optimizer = keras.optimizers.Adam()
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def train_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
            return loss

        times = []
        for i in range(steps):
            start = time.perf_counter()
            float(train_step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]))
            times.append(time.perf_counter() - start)
        print(json.dumps({"step_ms": [t * 1e3 for t in times[warmup:]], "devices": devices}))
        return

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []
            self.start = 0.0

        def on_train_batch_begin(self, batch, logs=None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.times.append(time.perf_counter() - self.start)

    timer = Timer()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    print(json.dumps({"step_ms": [t * 1e3 for t in timer.times[warmup:]], "devices": devices}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(model_name: str, args: argparse.Namespace, endpoint: str | None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if endpoint is None:
        env["SALUS_TF_DISABLE"] = "1"
    else:
        env["SALUS_ENDPOINT"] = endpoint
    out = subprocess.run([sys.executable, __file__, "--child", model_name, "--steps",
                          str(args.steps), "--warmup", str(args.warmup)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="alternating runs of each side")
    p.add_argument("--out", default=str(REPO / "results" / "tensorflow_compare.json"))
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        child(args.child, args.steps, args.warmup)
        return
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    server = subprocess.Popen([str(SERVER), "--listen", endpoint, "--memory", "4GiB",
                               "--policy", "fair", "--metrics-listen", f"127.0.0.1:{free_port()}"],
                              stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    results = {}
    try:
        for name in args.models.split(","):
            salus_ms: list[float] = []
            tf_ms: list[float] = []
            for _ in range(args.rounds):
                s = run_child(name, args, endpoint)
                assert "SALUS" in s["devices"]
                salus_ms += s["step_ms"]
                tf_ms += run_child(name, args, None)["step_ms"]
            row = {"salus_median_ms": statistics.median(salus_ms),
                   "tensorflow_median_ms": statistics.median(tf_ms)}
            row["ratio"] = row["salus_median_ms"] / row["tensorflow_median_ms"]
            results[name] = row
            print(f"{name}: SALUS {row['salus_median_ms']:.2f} ms/step, TensorFlow CPU "
                  f"{row['tensorflow_median_ms']:.2f} ms/step, ratio {row['ratio']:.2f}x",
                  flush=True)
    finally:
        server.terminate()
        server.wait()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": os.cpu_count(), "models": results},
                                         indent=2))


if __name__ == "__main__":
    main()
