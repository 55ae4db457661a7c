"""Training iteration time of the engine on a GPU against PyTorch, side by side in one run.

    python3 benchmarks/gpu/train_compare.py [--device cuda:0] [--bin build/bin] [--out DIR]
        [--models mlp,lenet5,resnet,espcn,vae] [--batches 32,256] [--iters 50] [--warmup 10]
        [--convolution-transforms]

Per reference model (benchmarks/models) and batch, the median milliseconds of one training
step after warm-up, from host feeds to the loss on the host:

  engine   salus-exec-bench --train loss --device D: the training executable in-process (its
           forward, backward and SGD update, lr 0.01, momentum 0.9), the feeds copied in, the
           loss copied out; its kernels replayed as one device graph, and again launched one
           by one (--no-graphs): the difference is the launch time the graph saves;
  PyTorch  the same architecture and loss as a torch module holding the ONNX file's
           initializers (compare.py's modules), cuDNN on, TF32 off: the feeds moved to the
           device, zero_grad, forward, loss, backward, torch.optim.SGD(lr=0.01,
           momentum=0.9).step(), and loss.item(); timed twice, with cuDNN free to choose
           any algorithm (PyTorch's default) and with torch.backends.cudnn.deterministic,
           which keeps cuDNN to deterministic algorithms as the engine always does.

Target: engine/PyTorch <= 1.1. Writes gpu-train-<device>.json and .md under --out (default
$OUT when set, else results/). `--device cpu` runs both on the CPU (a smoke check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    MODELS_DIR,
    REPO,
    SAMPLE,
    TorchBench,
    cell,
    checked_args,
    load_onnx_weights,
    make_feeds,
    median,
    ratio,
    salus_env,
    shapes,
    torch_module,
)

TARGET = 1.1
LR, MOMENTUM = 0.01, 0.9  # salus-exec-bench's optimizer for --train


def engine_ms(args: argparse.Namespace, model: str, batch: int, profile: bool = False,
              graphs: bool = True) -> dict[str, Any]:
    cmd = [str(args.bin / "salus-exec-bench"), "--model", str(MODELS_DIR / f"{model}.onnx"),
           "--device", args.device, "--train", "loss", "--warmup", str(args.warmup),
           "--iters", str(args.iters)]
    for name, shape in shapes(model, batch).items():
        cmd += ["--input", f"{name}={','.join(str(d) for d in shape)}"]
    if profile:
        cmd.append("--profile")
    if not graphs:
        cmd.append("--no-graphs")
    if args.convolution_transforms:
        cmd.append("--convolution-transforms")
    r = subprocess.run(cmd, capture_output=True, text=True, env=salus_env(), timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]}
    out = dict(json.loads(r.stdout.strip().splitlines()[-1]))
    if profile:  # "<op> <ms> ms/iter" per op type, slowest first
        ops = [line.split()[:2] for line in r.stderr.splitlines() if line.endswith(" ms/iter")]
        out["profile"] = sorted(((op, float(ms)) for op, ms in ops), key=lambda p: -p[1])
    return out


def torch_loss(model: str, m: Any, t: dict[str, Any]) -> Any:
    """The ONNX model's loss output (make_models.py), computed by the torch module."""
    import torch
    from torch.nn import functional as F

    if model in ("mlp", "lenet5", "resnet"):
        return F.cross_entropy(m(t["x"]), t["labels"])
    if model == "espcn":
        return ((m(t["x"]) - t["target"]) ** 2).mean()
    if model == "vae":
        h = torch.relu(m.enc(t["x"]))
        mu, logvar = m.mu(h), m.logvar(h)
        z = mu + torch.exp(logvar * 0.5) * t["eps"]
        recon = torch.sigmoid(m.out(torch.relu(m.dec(z))))
        rec = ((recon - t["x"]) ** 2).sum(1)
        kl = (1 + logvar - mu * mu - torch.exp(logvar)).sum(1) * -0.5
        return (rec + kl).mean()
    raise ValueError(model)


def torch_ms(tb: TorchBench, model: str, feeds: dict[str, np.ndarray], warmup: int,
             iters: int, deterministic: bool = False) -> float:
    torch = tb.torch
    torch.backends.cudnn.deterministic = deterministic
    m = torch_module(model)
    load_onnx_weights(m, model)
    m = m.to(tb.dev).train()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    host = {n: torch.from_numpy(v) for n, v in feeds.items()}

    def step() -> float:
        t = {n: v.to(tb.dev) for n, v in host.items()}
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(model, m, t)
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in range(warmup):
        step()
    tb.sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return median(times)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [f"# GPU benchmark: training on {env['device']} ({env.get('device_name', '?')})", "",
             f"Median ms per training step (SGD, lr {LR}, momentum {MOMENTUM}) after "
             f"{env['warmup']} warm-up, of "
             f"{env['iters']}; host feeds to the loss on the host. Target: engine/PyTorch <= "
             f"{TARGET}.", "", f"- torch: {env['torch']}",
             "- engine: convolution transforms "
             + ("on" if env.get("convolution_transforms") else "off"),
             "",
             "| model | batch | engine | engine, no graphs | saved by the graph | PyTorch "
             "| engine/PyTorch | no graphs/PyTorch | PyTorch, deterministic cuDNN "
             "| engine/that | P (MiB) | E (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p = r.get("P_bytes")
        e = r.get("E_bytes")
        saved = (r["engine_no_graphs_ms"] - r["engine_ms"]
                 if "engine_no_graphs_ms" in r and "engine_ms" in r else None)
        lines.append(
            f"| {r['model']} | {r['batch']} | {cell(r.get('engine_ms', r.get('engine_error')))} "
            f"| {cell(r.get('engine_no_graphs_ms'))} | {cell(saved)} "
            f"| {cell(r.get('torch_ms', r.get('torch_error')))} "
            f"| {cell(r.get('engine_vs_torch'), 2)} "
            f"| {cell(ratio(r.get('engine_no_graphs_ms'), r.get('torch_ms')), 2)} "
            f"| {cell(r.get('torch_deterministic_ms'))} "
            f"| {cell(r.get('engine_vs_torch_deterministic'), 2)} "
            f"| {cell(p / 2**20 if p else None, 2)} | {cell(e / 2**20 if e else None, 2)} |")
    profiled = [r for r in rows if r.get("profile")]
    if profiled:
        lines += ["", "Engine ms per op type and step (a run with per-op synchronisation), the "
                  "five slowest:", ""]
        for r in profiled:
            top = ", ".join(f"{op} {ms:.3f}" for op, ms in r["profile"][:5])
            lines.append(f"- {r['model']} batch {r['batch']}: {top}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    ap.add_argument("--bin", type=Path, default=REPO / "build" / "bin")
    ap.add_argument("--models", default=",".join(SAMPLE))
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--profile", action="store_true",
                    help="also run each engine step once more with per-op timing (not the "
                    "timed run) and list its five slowest op types")
    ap.add_argument("--convolution-transforms", action="store_true",
                    help="compile the engine's steps as a session with convolution_transforms "
                    "(cuDNN's FFT and Winograd algorithms admitted)")
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "results")
    args = ap.parse_args()
    models, batches = checked_args(ap, args)
    stem = "gpu-train-" + args.device.replace(":", "")
    tb = TorchBench(args.device, False)
    env: dict[str, Any] = {"device": args.device, "iters": args.iters, "warmup": args.warmup,
                           "torch": tb.error or f"{tb.version}, cuDNN {tb.cudnn}, TF32 off",
                           "convolution_transforms": args.convolution_transforms}
    if not tb.error:
        env["device_name"] = tb.name
    rows: list[dict[str, Any]] = []
    for model in models:
        for batch in batches:
            print(f"{model} batch {batch} ...", file=sys.stderr, flush=True)
            row: dict[str, Any] = {"model": model, "batch": batch}
            r = engine_ms(args, model, batch)
            if "error" in r:
                row["engine_error"] = r["error"]
            else:
                row["engine_ms"] = r["median_ms"]
                row["P_bytes"], row["E_bytes"] = r["persistent_bytes"], r["ephemeral_bytes"]
            nog = engine_ms(args, model, batch, graphs=False)
            if "error" not in nog:
                row["engine_no_graphs_ms"] = nog["median_ms"]
            row["graph_replays"] = r.get("graph_replays")
            if args.profile and "error" not in r:
                prof = engine_ms(args, model, batch, profile=True).get("profile", [])
                row["profile"] = prof
            if not tb.error:
                try:
                    feeds = make_feeds(model, batch)
                    row["torch_ms"] = torch_ms(tb, model, feeds, args.warmup, args.iters)
                    row["torch_deterministic_ms"] = torch_ms(tb, model, feeds, args.warmup,
                                                             args.iters, deterministic=True)
                except Exception as e:  # reported in the table; the run goes on
                    row["torch_error"] = f"{type(e).__name__}: {e}"
            row["engine_vs_torch"] = ratio(row.get("engine_ms"), row.get("torch_ms"))
            row["engine_vs_torch_deterministic"] = ratio(row.get("engine_ms"),
                                                         row.get("torch_deterministic_ms"))
            rows.append(row)
    md = markdown(rows, env)
    (args.out / f"{stem}.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    (args.out / f"{stem}.md").write_text(md)
    print(md)
    print(f"wrote {args.out / stem}.json and .md", file=sys.stderr)
    return 1 if any("engine_error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
