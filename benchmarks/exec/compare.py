"""Iteration time of the engine against PyTorch and onnxruntime on the CPU.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/exec/compare.py [--build build] [--iters 20]
        [--models mlp,resnet,resnet18,...]

Needs benchmarks/requirements.txt. For the reference models of benchmarks/models (the MLP
784-512-512-10 and the small ResNet of make_models.py; ResNet-18, MobileNetV2, the Transformer
encoder, the GPT decoder and the LSTM of make_torch_models.py), at the same batch and 2 threads:
training iterations (forward, backward, SGD with momentum) of the engine and of the same module
in PyTorch (in training mode: BatchNorm on batch statistics), and inference of the engine,
PyTorch and onnxruntime on the same ONNX file. Prints a Markdown table of median milliseconds
and ratios, and the planner's P and E next to PyTorch's peak resident-memory growth over a
training run (PyTorch's CPU allocator keeps no statistics of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

THREADS = 2
MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
# The models of make_models.py; the others are make_torch_models.py's.
HAND_WRITTEN = ("mlp", "resnet")
BATCH = {"mlp": 64, "resnet": 32, "resnet18": 32, "mobilenetv2": 32, "transformer": 32,
         "gpt": 16, "lstm": 32}


def exported():
    sys.path.insert(0, MODELS_DIR)
    import make_torch_models

    return make_torch_models


def torch_model(name: str):
    import torch
    from torch import nn

    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))

    class Block(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
            self.c2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
            self.proj = None if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride)

        def forward(self, x):
            h = self.c2(torch.relu(self.c1(x)))
            return torch.relu(h + (x if self.proj is None else self.proj(x)))

    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), Block(16, 16, 1), Block(16, 32, 2),
                         Block(32, 32, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def inputs(name: str, batch: int) -> tuple[np.ndarray, np.ndarray, str]:
    """The data input, the labels and the data input's name."""
    if name in HAND_WRITTEN:
        shape = (batch, 784) if name == "mlp" else (batch, 3, 32, 32)
        rng = np.random.RandomState(0)
        return rng.rand(*shape).astype(np.float32), rng.randint(0, 10, batch), "x"
    m = exported()
    x, labels = m.example_inputs(name, batch)
    return x.numpy(), labels.numpy(), m.MODELS[name].input


def median_ms(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def torch_times(name: str, batch: int, iters: int) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    x_np, y_np, _ = inputs(name, batch)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).long()
    if name in HAND_WRITTEN:
        net = torch_model(name)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            return loss_fn(net(x), y)

        def infer():
            return net(x)
        model = net
    else:
        model = exported().build(name)

        def step():
            return model(x, y)[0]

        def infer():
            return model(x, y)[1]
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def train() -> None:
        opt.zero_grad()
        step().backward()
        opt.step()

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    train_ms = median_ms(train, 5, iters)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    model.eval()
    with torch.no_grad():
        infer_ms = median_ms(infer, 5, iters)
    return {"train_ms": train_ms, "infer_ms": infer_ms, "peak_rss_growth_bytes": peak_kib * 1024}


def ort_time(name: str, batch: int, iters: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(os.path.join(MODELS_DIR, f"{name}.onnx"), so,
                                providers=["CPUExecutionProvider"])
    x, labels, x_name = inputs(name, batch)
    feeds = {x_name: x, "labels": labels.astype(np.int64)}
    return median_ms(lambda: sess.run(["logits"], feeds), 5, iters)


def salus_times(build: str, name: str, batch: int, iters: int) -> tuple[dict, dict]:
    exe = os.path.join(build, "bin", "salus-exec-bench")
    x, labels, x_name = inputs(name, batch)
    dims = ",".join(str(d) for d in x.shape)
    ldims = ",".join(str(d) for d in labels.shape)
    base = [exe, "--model", os.path.join(MODELS_DIR, f"{name}.onnx"), "--input",
            f"{x_name}={dims}", "--input", f"labels={ldims}", "--iters", str(iters)]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), OMP_WAIT_POLICY="PASSIVE")
    train = json.loads(subprocess.check_output(base + ["--train", "loss"], env=env))
    infer = json.loads(subprocess.check_output(base + ["--fetch", "logits"], env=env))
    return train, infer


def main() -> None:
    # Threads that spin while they wait turn a loaded machine's scheduling noise into
    # many-fold slowdowns; every framework here sleeps instead (onnxruntime: allow_spinning=0).
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if len(sys.argv) == 5 and sys.argv[1] == "--torch-only":
        print(json.dumps(torch_times(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--models", default=",".join(BATCH))
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        batch = BATCH[name]
        train, infer = salus_times(args.build, name, batch, args.iters)
        # PyTorch in a fresh process each time, so its peak RSS growth is this model's alone.
        t = json.loads(subprocess.check_output(
            [sys.executable, __file__, "--torch-only", name, str(batch), str(args.iters)],
            env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE")))
        o = ort_time(name, batch, args.iters)
        rows.append((name, batch, train, infer, t, o))
    print(f"CPU, {THREADS} threads; median ms per iteration\n")
    print("| model | batch | salus train | torch train | ratio | salus infer | torch infer | "
          "ort infer | ratio vs ort | P | E (train) | torch peak RSS growth |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, batch, train, infer, t, o in rows:
        print(f"| {name} | {batch} | {train['median_ms']:.2f} | {t['train_ms']:.2f} | "
              f"{train['median_ms'] / t['train_ms']:.2f}x | {infer['median_ms']:.2f} | "
              f"{t['infer_ms']:.2f} | {o:.2f} | {infer['median_ms'] / o:.2f}x | "
              f"{train['persistent_bytes'] / 2**20:.2f} MiB | "
              f"{train['ephemeral_bytes'] / 2**20:.2f} MiB | "
              f"{t['peak_rss_growth_bytes'] / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
