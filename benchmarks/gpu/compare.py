"""Inference iteration time of the engine on a GPU against PyTorch, onnxruntime and the daemon.

    python3 benchmarks/gpu/compare.py [--device cuda:0] [--bin build/bin] [--out DIR]
        [--models mlp,lenet5,resnet,espcn,vae] [--batches 1,32,256] [--iters 100] [--warmup 20]

Per reference model (benchmarks/models) and batch, side by side in one run, the median
milliseconds of one inference iteration after warm-up, from host feeds to host outputs:

  engine     salus-exec-bench --device D, fetching the prediction (logits, y or recon): the
             executable in-process, the feeds copied in and the prediction copied out;
  PyTorch    the same architecture as a torch module holding the ONNX file's initializers,
             cuDNN on, TF32 off for convolutions and matrix products (like our FP32 kernels),
             `x.to(device)`, forward, `.cpu()`; also with the inputs already on the device
             ("resident"), synchronised after the forward;
  ORT        onnxruntime on the same ONNX file with the CUDA provider (TF32 off) when
             `onnxruntime.get_available_providers()` has it; on `--device cpu`, the CPU provider;
  daemon     a `salus-server --device D` inference session on the same model, timed at the
             client per iteration (request, scheduling, the iteration, the reply), one iteration
             at a time and with two in flight; against the engine in-process compiled as the
             daemon compiles it (every graph output fetchable: salus-exec-bench with no --fetch).

The predictions of the engine (through the daemon), PyTorch and onnxruntime, for the same batch,
are checked against each other (so are the PyTorch module's weights): the `check` column is the
largest difference of any two, relative to the largest output; above 1e-3 fails the run.
Targets: engine/PyTorch <= 1.1, daemon/in-process < 1.03. Writes gpu-bench-<device>.json and
.md under --out (default $OUT when set, else results/). PyTorch and onnxruntime are optional:
a column whose framework is missing says so. `--device cpu` runs everything on the CPU (a
smoke check of the script). The salus binaries get $SALUS_LD_LIBRARY_PATH prepended to their
LD_LIBRARY_PATH (scripts/gpu-check sets it); this process's own libraries are left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "benchmarks" / "models"
# Per-sample input shapes (make_models.py) and the prediction output of each reference model.
SAMPLE: dict[str, dict[str, tuple[int, ...]]] = {
    "mlp": {"x": (784,), "labels": ()},
    "lenet5": {"x": (1, 28, 28), "labels": ()},
    "resnet": {"x": (3, 32, 32), "labels": ()},
    "espcn": {"x": (1, 16, 16), "target": (1, 48, 48)},
    "vae": {"x": (784,), "eps": (20,)},
}
PREDICTION = {"mlp": "logits", "lenet5": "logits", "resnet": "logits", "espcn": "y",
              "vae": "recon"}
# The inputs the prediction depends on, in the torch module's argument order.
PREDICTION_INPUTS = {"mlp": ["x"], "lenet5": ["x"], "resnet": ["x"], "espcn": ["x"],
                     "vae": ["x", "eps"]}
ENGINE_TARGET, DAEMON_TARGET = 1.1, 1.03
READY_TIMEOUT_S = 60.0


def shapes(model: str, batch: int) -> dict[str, tuple[int, ...]]:
    return {n: (batch, *s) for n, s in SAMPLE[model].items()}


def make_feeds(model: str, batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes(model, batch).items():
        if name == "labels":
            out[name] = rng.integers(0, 10, shape).astype(np.int64)
        else:
            out[name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return out


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def salus_env() -> dict[str, str]:
    env = dict(os.environ)
    extra = os.environ.get("SALUS_LD_LIBRARY_PATH", "")
    if extra:
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (extra, env.get("LD_LIBRARY_PATH", "")) if p)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a - b| relative to the largest |b|: how far apart two outputs are."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        return float("inf")
    return float(np.max(np.abs(a64 - b64)) / max(float(np.max(np.abs(b64))), 1e-30))


# -- the engine in-process --------------------------------------------------------------------
def engine_ms(args: argparse.Namespace, model: str, batch: int, prediction_only: bool) -> dict:
    cmd = [str(args.bin / "salus-exec-bench"), "--model", str(MODELS_DIR / f"{model}.onnx"),
           "--device", args.device, "--warmup", str(args.warmup), "--iters", str(args.iters)]
    for name, shape in shapes(model, batch).items():
        cmd += ["--input", f"{name}={','.join(str(d) for d in shape)}"]
    if prediction_only:
        cmd += ["--fetch", PREDICTION[model]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=salus_env(), timeout=300)
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


# -- PyTorch ----------------------------------------------------------------------------------
def torch_module(model: str) -> Any:
    """The reference model's prediction path as a torch module whose parameters are in the
    order of the ONNX file's initializers (weight, bias, layer by layer)."""
    import torch
    from torch import nn

    if model == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if model == "lenet5":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                             nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                             nn.Linear(84, 10))
    if model == "resnet":
        class Block(nn.Module):
            def __init__(self, c_in: int, c_out: int, stride: int) -> None:
                super().__init__()
                self.c1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
                self.c2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
                self.proj = (None if stride == 1 and c_in == c_out
                             else nn.Conv2d(c_in, c_out, 1, stride))

            def forward(self, x: Any) -> Any:
                h = self.c2(torch.relu(self.c1(x)))
                return torch.relu(h + (x if self.proj is None else self.proj(x)))

        return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), Block(16, 16, 1),
                             Block(16, 32, 2), Block(32, 32, 1), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(32, 10))
    if model == "espcn":
        # DepthToSpace in DCR mode equals PixelShuffle (CRD) here: one output channel.
        return nn.Sequential(nn.Conv2d(1, 64, 5, 1, 2), nn.Tanh(), nn.Conv2d(64, 32, 3, 1, 1),
                             nn.Tanh(), nn.Conv2d(32, 9, 3, 1, 1), nn.PixelShuffle(3))
    if model == "vae":
        class Vae(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.enc = nn.Linear(784, 256)
                self.mu = nn.Linear(256, 20)
                self.logvar = nn.Linear(256, 20)
                self.dec = nn.Linear(20, 256)
                self.out = nn.Linear(256, 784)

            def forward(self, x: Any, eps: Any) -> Any:
                h = torch.relu(self.enc(x))
                z = self.mu(h) + torch.exp(self.logvar(h) * 0.5) * eps
                return torch.sigmoid(self.out(torch.relu(self.dec(z))))

        return Vae()
    raise ValueError(model)


def load_onnx_weights(module: Any, model: str) -> None:
    import onnx
    import torch
    from onnx import numpy_helper

    inits = [numpy_helper.to_array(t) for t in onnx.load(str(MODELS_DIR / f"{model}.onnx"))
             .graph.initializer]
    params = list(module.parameters())
    if len(inits) != len(params):
        raise RuntimeError(f"{model}: {len(inits)} initializers, {len(params)} torch parameters")
    with torch.no_grad():
        for p, w in zip(params, inits, strict=True):
            if tuple(p.shape) != w.shape:
                raise RuntimeError(f"{model}: parameter {tuple(p.shape)} against {w.shape}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))


class TorchBench:
    """PyTorch on one device, TF32 off, cuDNN on; None-like (`error`) when unavailable."""

    def __init__(self, device: str, cudnn_benchmark: bool) -> None:
        self.error = ""
        try:
            import torch
        except ImportError as e:
            self.error = f"not installed ({e})"
            return
        self.torch = torch
        if device.startswith("cuda") and not torch.cuda.is_available():
            self.error = "torch sees no GPU"
            return
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.benchmark = cudnn_benchmark
        torch.set_float32_matmul_precision("highest")
        self.dev = torch.device(device)
        self.cuda = device.startswith("cuda")
        self.version = torch.__version__
        self.cudnn = torch.backends.cudnn.version() if self.cuda else None
        self.name = torch.cuda.get_device_name(self.dev) if self.cuda else "cpu"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def measure(self, model: str, batch: int, warmup: int, iters: int,
                feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        torch = self.torch
        m = torch_module(model)
        load_onnx_weights(m, model)
        m = m.to(self.dev).eval()
        host = [torch.from_numpy(feeds[n]) for n in PREDICTION_INPUTS[model]]
        resident = [t.to(self.dev) for t in host]

        def from_host() -> Any:
            return m(*[t.to(self.dev) for t in host]).cpu()

        def on_device() -> Any:
            y = m(*resident)
            self.sync()
            return y

        out: dict[str, Any] = {}
        with torch.inference_mode():
            for key, fn in (("host_ms", from_host), ("resident_ms", on_device)):
                for _ in range(warmup):
                    fn()
                self.sync()
                times = []
                for _ in range(iters):
                    start = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - start) * 1e3)
                out[key] = median(times)
            out["prediction"] = from_host().numpy()
        return out


# -- onnxruntime ------------------------------------------------------------------------------
class OrtBench:
    def __init__(self, device: str) -> None:
        self.error = ""
        try:
            import onnxruntime as ort
        except ImportError as e:
            self.error = f"not installed ({e})"
            return
        self.ort = ort
        self.version = ort.__version__
        self.available = ort.get_available_providers()
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in self.available:
                self.error = (f"not available: onnxruntime {ort.__version__} has providers "
                              f"{self.available} (the CUDA provider comes with onnxruntime-gpu)")
                return
            ordinal = int(device.partition(":")[2] or 0)
            self.providers: list[Any] = [("CUDAExecutionProvider",
                                          {"device_id": ordinal, "use_tf32": 0})]
        else:
            self.providers = ["CPUExecutionProvider"]

    def measure(self, model: str, warmup: int, iters: int,
                feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        sess = self.ort.InferenceSession(str(MODELS_DIR / f"{model}.onnx"), so,
                                         providers=self.providers)
        used = sess.get_providers()
        if self.providers[0] != "CPUExecutionProvider" and "CUDAExecutionProvider" not in used:
            return {"error": f"the CUDA provider did not load (session providers {used})"}
        fetch = [PREDICTION[model]]
        for _ in range(warmup):
            sess.run(fetch, feeds)
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            sess.run(fetch, feeds)
            times.append((time.perf_counter() - start) * 1e3)
        return {"ms": median(times), "prediction": sess.run(fetch, feeds)[0]}


# -- the daemon -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A salus-server on the device, on a loopback port; stop() drains it with SIGTERM."""

    def __init__(self, args: argparse.Namespace, log_path: Path) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        cmd = [str(args.bin / "salus-server"), "--device", args.device, "--memory",
               args.memory, "--listen", self.endpoint, "--policy", "fifo",
               "--metrics-listen", f"127.0.0.1:{free_port()}"]
        self.log = open(log_path, "w")  # closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=salus_env())
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        if not ready.wait(READY_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"salus-server did not become ready (log: {log_path})")

    def _read(self, ready: threading.Event) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.write(line)
            if "event: ready " in line:
                ready.set()
        ready.set()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.1)
        self.log.close()
        return int(self.proc.returncode)


def daemon_ms(endpoint: str, model: str, batch: int, warmup: int, iters: int,
              feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "adaptors" / "python"))
    import salus

    fetch = [PREDICTION[model]]
    with salus.connect(endpoint, timeout=120, name=f"gpu-bench-{model}") as c:
        s = c.create_session(model=MODELS_DIR / f"{model}.onnx", mode="infer",
                             inputs=shapes(model, batch), name=model)
        wall, run = [], []
        for i in range(warmup + iters):
            start = time.perf_counter()
            out = s.run(feeds, fetches=fetch)
            dt = (time.perf_counter() - start) * 1e3
            if i >= warmup and s.last_stats is not None:
                wall.append(dt)
                run.append(s.last_stats.run_us / 1e3)
        # Two iterations in flight: the next one's request travels while this one runs.
        for _ in range(warmup):
            s.run(feeds, fetches=fetch)
        start = time.perf_counter()
        pending = s.submit(feeds, fetches=fetch)
        for _ in range(iters - 1):
            nxt = s.submit(feeds, fetches=fetch)
            pending.result()
            pending = nxt
        pending.result()
        pipelined = (time.perf_counter() - start) * 1e3 / iters
        s.close()
    return {"sync_ms": median(wall), "run_ms": median(run), "pipelined_ms": pipelined,
            "prediction": out[PREDICTION[model]]}


# -- the run ----------------------------------------------------------------------------------
def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, float | int) and isinstance(b, float | int) and b > 0:
        return float(a) / float(b)
    return None


def cell(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    head = [f"# GPU benchmark: inference on {env['device']} ({env.get('device_name', '')})", "",
            f"Median ms per iteration after {env['warmup']} warm-up, of {env['iters']}; host "
            "feeds to host outputs. Targets: engine/PyTorch <= "
            f"{ENGINE_TARGET}, daemon/in-process < {DAEMON_TARGET}.", ""]
    for key in ("torch", "onnxruntime", "daemon"):
        head.append(f"- {key}: {env.get(key, '')}")
    head.append("")
    fields = ["model", "batch", "engine", "PyTorch", "engine/PyTorch", "PyTorch resident",
              "ORT", "engine/ORT", "check", "in-process (all outputs)", "daemon",
              "daemon/in-process", "daemon 2 in flight", "ratio"]
    lines = ["| " + " | ".join(fields) + " |", "|" + " --- |" * len(fields)]
    for r in rows:
        vals = [r["model"], r["batch"], cell(r.get("engine_ms")), cell(r.get("torch_ms")),
                cell(r.get("engine_vs_torch"), 2), cell(r.get("torch_resident_ms")),
                cell(r.get("ort_ms")), cell(r.get("engine_vs_ort"), 2),
                "n/a" if r.get("check") is None else f"{r['check']:.1e}",
                cell(r.get("engine_all_ms")), cell(r.get("daemon_ms")),
                cell(r.get("daemon_vs_in_process"), 3), cell(r.get("daemon_pipelined_ms")),
                cell(r.get("daemon_pipelined_vs_in_process"), 3)]
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    errors = [f"- {r['model']} batch {r['batch']}: {k}: {v}" for r in rows
              for k, v in r.items() if k.endswith("_error")]
    tail = ["", "Errors:", *errors] if errors else []
    return "\n".join(head + lines + tail) + "\n"


def checked_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str],
                                                                              list[int]]:
    """--device, --models and --batches checked (ap.error otherwise), and --out created."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device {args.device}: expected cpu or cuda:N")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in SAMPLE:
            ap.error(f"unknown model {m!r} (known: {', '.join(SAMPLE)})")
    args.out.mkdir(parents=True, exist_ok=True)
    return models, [int(b) for b in args.batches.split(",") if b]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    ap.add_argument("--bin", type=Path, default=REPO / "build" / "bin",
                    help="folder of salus-exec-bench and salus-server")
    ap.add_argument("--models", default=",".join(SAMPLE))
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--memory", default="4GiB", help="the daemon's arena")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let PyTorch time cuDNN's algorithms (torch.backends.cudnn.benchmark)")
    ap.add_argument("--no-daemon", action="store_true")
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "results")
    args = ap.parse_args()
    models, batches = checked_args(ap, args)
    stem = "gpu-bench-" + args.device.replace(":", "")

    tb = TorchBench(args.device, args.cudnn_benchmark)
    ob = OrtBench(args.device)
    env: dict[str, Any] = {"device": args.device, "iters": args.iters, "warmup": args.warmup,
                           "torch": tb.error or f"{tb.version}, cuDNN {tb.cudnn}, TF32 off, "
                           f"cudnn.benchmark={args.cudnn_benchmark}",
                           "onnxruntime": ob.error or f"{ob.version}, {ob.providers[0]}"}
    if not tb.error:
        env["device_name"] = tb.name
    devices = subprocess.run([str(args.bin / "salus-devices"), "--json"], capture_output=True,
                             text=True, env=salus_env())
    if devices.returncode == 0:
        env["salus_devices"] = json.loads(devices.stdout)
    server = None
    if args.no_daemon:
        env["daemon"] = "not run (--no-daemon)"
    else:
        try:
            server = Server(args, args.out / f"{stem}-server.log")
            env["daemon"] = f"salus-server --device {args.device} --policy fifo, tcp loopback"
        except (OSError, RuntimeError) as e:
            env["daemon"] = f"failed to start: {e}"

    rows: list[dict[str, Any]] = []
    try:
        for model in models:
            for batch in batches:
                print(f"{model} batch {batch} ...", file=sys.stderr, flush=True)
                row: dict[str, Any] = {"model": model, "batch": batch}
                feeds = make_feeds(model, batch)
                for key, pred_only in (("engine", True), ("engine_all", False)):
                    r = engine_ms(args, model, batch, pred_only)
                    if "error" in r:
                        row[f"{key}_error"] = r["error"]
                    else:
                        row[f"{key}_ms"] = r["median_ms"]
                        row["P_bytes"], row[f"{key}_E_bytes"] = (r["persistent_bytes"],
                                                                 r["ephemeral_bytes"])
                refs: dict[str, np.ndarray] = {}
                if not tb.error:
                    try:
                        t = tb.measure(model, batch, args.warmup, args.iters, feeds)
                        row["torch_ms"], row["torch_resident_ms"] = t["host_ms"], t["resident_ms"]
                        refs["torch"] = t["prediction"]
                    except Exception as e:  # reported in the table; the run goes on
                        row["torch_error"] = f"{type(e).__name__}: {e}"
                if not ob.error:
                    try:
                        o = ob.measure(model, args.warmup, args.iters, feeds)
                        if "error" in o:
                            row["ort_error"] = o["error"]
                        else:
                            row["ort_ms"] = o["ms"]
                            refs["ort"] = o["prediction"]
                    except Exception as e:  # reported in the table; the run goes on
                        row["ort_error"] = f"{type(e).__name__}: {e}"
                if server is not None:
                    try:
                        d = daemon_ms(server.endpoint, model, batch, args.warmup, args.iters,
                                      feeds)
                        row["daemon_ms"], row["daemon_run_ms"] = d["sync_ms"], d["run_ms"]
                        row["daemon_pipelined_ms"] = d["pipelined_ms"]
                        refs["engine"] = d["prediction"]
                    except Exception as e:  # reported in the table; the run goes on
                        row["daemon_error"] = f"{type(e).__name__}: {e}"
                pairs = [(a, b) for a, b in (("engine", "torch"), ("engine", "ort"),
                                             ("torch", "ort")) if a in refs and b in refs]
                if pairs:
                    row["check"] = max(rel_diff(refs[a], refs[b]) for a, b in pairs)
                    row["check_pairs"] = [f"{a}/{b}" for a, b in pairs]
                row["engine_vs_torch"] = ratio(row.get("engine_ms"), row.get("torch_ms"))
                row["engine_vs_ort"] = ratio(row.get("engine_ms"), row.get("ort_ms"))
                row["daemon_vs_in_process"] = ratio(row.get("daemon_ms"),
                                                    row.get("engine_all_ms"))
                row["daemon_pipelined_vs_in_process"] = ratio(row.get("daemon_pipelined_ms"),
                                                              row.get("engine_all_ms"))
                rows.append(row)
    finally:
        if server is not None:
            env["daemon_exit"] = server.stop()

    md = markdown(rows, env)
    (args.out / f"{stem}.md").write_text(md)
    (args.out / f"{stem}.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    print(md)
    print(f"wrote {args.out / stem}.json and .md", file=sys.stderr)
    failed = [r for r in rows if any(k.endswith("_error") for k in r)]
    mismatched = [r for r in rows if r.get("check") is not None and r["check"] > 1e-3]
    for r in mismatched:
        print(f"MISMATCH: {r['model']} batch {r['batch']}: predictions of "
              f"{', '.join(r['check_pairs'])} differ by {r['check']:.2e} relative",
              file=sys.stderr)
    return 1 if failed or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
