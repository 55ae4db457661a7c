"""keras.applications on SALUS against TensorFlow's CPU: every architecture, trained as a new user
would (weights=None, small inputs, default Adam, sparse_categorical_crossentropy, model.fit for
two epochs with a last short batch, then evaluate and predict).

Each model runs twice in child processes of .venv-tf: once on SALUS (a salus-server this script
starts, or --endpoint) and once on TensorFlow's CPU device (SALUS_TF_DISABLE=1), with the same
seed. Prints one table: the model, its parameters, the distinct TensorFlow ops of its captured
steps, the first step's status on SALUS, the largest relative difference of the per-epoch losses,
evaluate and predict outputs, the largest weight difference beyond rtol 1e-3, and the median
train-step time on SALUS over TensorFlow's (second epoch). The JSON lands in --out.

    .venv-tf/bin/python benchmarks/tensorflow/zoo.py                 # the whole zoo
    .venv-tf/bin/python benchmarks/tensorflow/zoo.py --models MobileNetV2,DenseNet121
    .venv-tf/bin/python benchmarks/tensorflow/zoo.py --subset ci     # what CI runs

A model is "ok" when it trains on SALUS and its losses agree to 1e-4 relative and its weights
to 1e-3 (relative, with 1e-3 absolute for weights near zero); with --spread, "within TF's
spread" when they do not but its untrained loss agrees to 1e-5 and its trained losses and
weights differ by at most three times what TensorFlow's Eigen kernels differ from its oneDNN
ones (docs/tensorflow.md, keras.applications).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(os.environ.get("SALUS_SERVER", REPO / "build" / "bin" / "salus-server"))

# Every keras.applications architecture of Keras 3 (the last of each size family stands for its
# larger siblings, which add depth and width but no ops), with the smallest input it accepts.
MODELS: dict[str, int] = {
    "VGG16": 32, "VGG19": 32,
    "ResNet50": 32, "ResNet101": 32, "ResNet152": 32,
    "ResNet50V2": 32, "ResNet101V2": 32, "ResNet152V2": 32,
    "MobileNet": 32, "MobileNetV2": 32, "MobileNetV3Small": 32, "MobileNetV3Large": 32,
    "EfficientNetB0": 32, "EfficientNetB1": 32, "EfficientNetB7": 32,
    "EfficientNetV2B0": 32, "EfficientNetV2S": 32,
    "DenseNet121": 32, "DenseNet169": 32, "DenseNet201": 32,
    "Xception": 71, "InceptionV3": 75, "InceptionResNetV2": 75,
    "NASNetMobile": 32, "NASNetLarge": 32,
    "ConvNeXtTiny": 32, "ConvNeXtSmall": 32,
}
# One of each family, small enough for CI's two cores.
SUBSETS = {
    "ci": ["MobileNetV3Small", "DenseNet121"],
    "families": ["VGG16", "ResNet50", "ResNet50V2", "MobileNet", "MobileNetV2",
                 "MobileNetV3Small", "MobileNetV3Large", "EfficientNetB0", "EfficientNetV2B0",
                 "DenseNet121", "Xception", "InceptionV3", "InceptionResNetV2", "NASNetMobile",
                 "ConvNeXtTiny"],
}
# Each architecture's module in keras.applications, whose preprocess_input a user applies.
MODULES = {"VGG": "vgg", "ResNet": "resnet", "MobileNet": "mobilenet",
           "EfficientNet": "efficientnet", "DenseNet": "densenet", "Xception": "xception",
           "InceptionV3": "inception_v3", "InceptionResNetV2": "inception_resnet_v2",
           "NASNet": "nasnet", "ConvNeXt": "convnext"}
BATCH, SAMPLES, EPOCHS, CLASSES = 8, 20, 2, 10
LOSS_RTOL, WEIGHT_RTOL, WEIGHT_ATOL, INITIAL_RTOL = 1e-4, 1e-3, 1e-3, 1e-5


def module_of(name: str) -> str:
    """keras.applications' module of `name` (mobilenet_v2 for MobileNetV2, resnet_v2, ...)."""
    if name.startswith("VGG"):
        return name.lower()
    family = next(f for f in MODULES if name.startswith(f))
    module = MODULES[family]
    rest = name[len(family):]
    if family in ("ResNet", "MobileNet", "EfficientNet") and ("V2" in rest or "V3" in rest):
        module += "_v3" if "V3" in rest else "_v2"
    return module


def preprocess(name: str, images):
    """The images as a user of `name` feeds them: its module's preprocess_input."""
    import importlib

    module = importlib.import_module(f"keras.applications.{module_of(name)}")
    return module.preprocess_input(images)


def child(name: str, size: int, weights_out: str) -> None:
    """Trains `name` on whatever device TensorFlow picks and prints one JSON line."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    x = preprocess(name, rng.uniform(0, 255, (SAMPLES, size, size, 3)).astype("float32"))
    y = rng.integers(0, CLASSES, SAMPLES).astype("int64")
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                              classes=CLASSES)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[tuple[int, float]] = []
            self.epoch = 0
            self.start = 0.0

        def on_epoch_begin(self, epoch, logs=None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None) -> None:
            self.times.append((self.epoch, time.perf_counter() - self.start))

    timer = Timer()
    out: dict = {"params": int(model.count_params()),
                 "devices": [d.device_type for d in tf.config.list_logical_devices()]}
    try:
        # The untrained model's loss: the forward pass alone, before any rounding compounds.
        out["initial"] = float(model.evaluate(x, y, batch_size=BATCH, verbose=0))
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                            callbacks=[timer])
        out["loss"] = history.history["loss"]
        out["evaluate"] = float(model.evaluate(x, y, batch_size=BATCH, verbose=0))
        out["predict"] = np.asarray(model.predict(x[:BATCH], batch_size=BATCH, verbose=0),
                                    dtype=np.float64).ravel().tolist()
        out["step_ms"] = [t * 1e3 for e, t in timer.times if e == EPOCHS - 1]
        np.savez(weights_out, *[np.asarray(w) for w in model.get_weights()])
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - the table reports any failure
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        # TensorFlow's "Graph execution error:" first; the cause is the line naming a node.
        cause = next((ln for ln in lines if "node '" in ln or "op " in ln),
                     lines[0] if lines else "")
        out["error"] = f"{type(e).__name__}: {cause[:300]}"
    print(json.dumps(out))


def run_child(name: str, workdir: Path, endpoint: str | None, timeout: float,
              eigen: bool = False) -> dict:
    side = "salus" if endpoint else "eigen" if eigen else "cpu"
    weights = workdir / f"{name}-{side}.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    if eigen:
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"  # TensorFlow's other CPU kernels
    if endpoint is None:
        env["SALUS_TF_DISABLE"] = "1"
    else:
        env.pop("SALUS_TF_DISABLE", None)
        env["SALUS_ENDPOINT"] = endpoint
        dump = workdir / f"{name}-graphs"
        dump.mkdir(exist_ok=True)
        env["SALUS_TF_DUMP_DIR"] = str(dump)
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--size",
                               str(MODELS[name]), "--weights", str(weights)],
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    out = json.loads(lines[-1])
    out["weights_file"] = str(weights)
    return out


def captured_ops(dump: Path) -> list[str]:
    """The distinct ops of the GraphDefs the adaptor captured (SALUS_TF_DUMP_DIR)."""
    from tensorflow.core.framework import graph_pb2

    ops: set[str] = set()
    for pb in dump.glob("*.pb"):
        g = graph_pb2.GraphDef()
        g.ParseFromString(pb.read_bytes())
        ops.update(n.op for n in g.node)
    return sorted(ops)


def rel_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True)), default=0.0)


def weight_excess(a_file: str, b_file: str) -> float:
    """The largest |a - b| beyond rtol 1e-3 of b, plus the 1e-3 absolute tolerance: at most 1e-3
    when every weight agrees."""
    import numpy as np

    wa, wb = np.load(a_file), np.load(b_file)
    worst = 0.0
    for k in wb.files:
        excess = np.abs(wa[k] - wb[k]) - WEIGHT_ATOL - WEIGHT_RTOL * np.abs(wb[k])
        worst = max(worst, float(np.max(excess, initial=-np.inf)) + WEIGHT_ATOL)
    return worst


def compare(name: str, salus: dict, cpu: dict, workdir: Path, eigen: dict | None) -> dict:
    import numpy as np

    row = {"model": name, "params": cpu.get("params", salus.get("params")),
           "ops": len(captured_ops(workdir / f"{name}-graphs"))}
    if cpu.get("error"):
        row["status"] = "TensorFlow CPU failed: " + cpu["error"]
        return row
    if salus.get("error"):
        row["status"] = salus["error"]
        return row
    if "SALUS" not in salus.get("devices", []):
        row["status"] = "SALUS device missing"
        return row
    row["initial_diff"] = rel_diff([salus["initial"]], [cpu["initial"]])
    row["loss_diff"] = max(rel_diff(salus["loss"], cpu["loss"]),
                           rel_diff([salus["evaluate"]], [cpu["evaluate"]]))
    row["predict_diff"] = float(np.max(np.abs(np.subtract(salus["predict"], cpu["predict"]))))
    worst = weight_excess(salus["weights_file"], cpu["weights_file"])
    row["weight_diff"] = worst  # above 1e-3: some weight outside rtol 1e-3 + atol 1e-3
    if eigen is not None and not eigen.get("error"):
        # TensorFlow against itself: its Eigen kernels against its oneDNN ones.
        row["tf_loss_spread"] = rel_diff(eigen["loss"], cpu["loss"])
        row["tf_weight_spread"] = weight_excess(eigen["weights_file"], cpu["weights_file"])
    row["step_ratio"] = (statistics.median(salus["step_ms"]) / statistics.median(cpu["step_ms"])
                         if salus["step_ms"] and cpu["step_ms"] else None)
    ok = rel_diff(salus["loss"], cpu["loss"]) <= LOSS_RTOL and worst <= WEIGHT_ATOL
    # TensorFlow's two CPU kernel sets drift apart too: within three times that drift (and with
    # the untrained model's loss equal), SALUS differs from TensorFlow as TensorFlow from itself.
    spread = ("tf_loss_spread" in row and row["initial_diff"] <= INITIAL_RTOL
              and row["loss_diff"] <= max(LOSS_RTOL, 3 * row["tf_loss_spread"])
              and worst <= max(WEIGHT_ATOL, 3 * row["tf_weight_spread"]))
    row["status"] = "ok" if ok else "within TF's spread" if spread else "mismatch"
    return row


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int) -> tuple[subprocess.Popen, str, tempfile.TemporaryDirectory]:
    run_dir = tempfile.TemporaryDirectory(prefix="salus-zoo-")
    endpoint = f"ipc://{run_dir.name}/salus.sock"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    server = subprocess.Popen([str(SERVER), "--listen", endpoint, "--memory", "8GiB",
                               "--policy", "fair", "--metrics-listen", f"127.0.0.1:{free_port()}"],
                              stderr=subprocess.DEVNULL, env=env)
    for _ in range(100):
        if Path(f"{run_dir.name}/salus.sock").exists():
            break
        time.sleep(0.1)
    return server, endpoint, run_dir


def cell(row: dict, key: str, fmt: str) -> str:
    """A table cell: row[key] formatted, or "-" where it is missing."""
    return format(row[key], fmt) if row.get(key) is not None else "-"


def print_table(rows: list[dict]) -> None:
    print("| model | params | ops | status | untrained loss diff | trained loss diff "
          "| max |predict| diff | weights beyond 1e-3 | TF's own loss / weight spread "
          "| step ratio |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['ops']} | {r['status']} | "
              f"{cell(r, 'initial_diff', '.1e')} | {cell(r, 'loss_diff', '.1e')} | "
              f"{cell(r, 'predict_diff', '.1e')} | "
              f"{cell(r, 'weight_diff', '.1e')} | {cell(r, 'tf_loss_spread', '.1e')} / "
              f"{cell(r, 'tf_weight_spread', '.1e')} | {cell(r, 'step_ratio', '.2f')} |",
              flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated names (default: all)")
    p.add_argument("--subset", choices=sorted(SUBSETS))
    p.add_argument("--endpoint", help="a running daemon (default: start one)")
    p.add_argument("--spread", action="store_true",
                   help="also run TensorFlow's Eigen CPU kernels: its own spread beside ours")
    p.add_argument("--threads", type=int, default=2, help="the daemon's OpenMP threads")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    p.add_argument("--out", default=str(REPO / "results" / "tensorflow_zoo.json"))
    p.add_argument("--child")
    p.add_argument("--size", type=int)
    p.add_argument("--weights")
    args = p.parse_args()
    if args.child:
        child(args.child, args.size, args.weights)
        return 0
    names = (args.models.split(",") if args.models
             else SUBSETS[args.subset] if args.subset else list(MODELS))
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    server = run_dir = None
    endpoint = args.endpoint
    if endpoint is None:
        server, endpoint, run_dir = start_server(args.threads)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="salus-zoo-work-") as work:
            workdir = Path(work)
            for name in names:
                salus = run_child(name, workdir, endpoint, args.timeout)
                cpu = run_child(name, workdir, None, args.timeout)
                eigen = (run_child(name, workdir, None, args.timeout, eigen=True)
                         if args.spread else None)
                rows.append(compare(name, salus, cpu, workdir, eigen))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
            run_dir.cleanup()
    print_table(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["status"] in ("ok", "within TF's spread") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
