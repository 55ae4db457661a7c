"""What every experiment shares: paths, the daemon's life cycle, the reference models and
their seeded feeds, the output folder, CSV and report writing."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# The salus binaries: build/bin, or $SALUS_BIN (a bundle unpacked elsewhere, as on a GPU
# machine, with $SALUS_LD_LIBRARY_PATH naming the folders of their libraries).
BIN = Path(os.environ["SALUS_BIN"]) if os.environ.get("SALUS_BIN") else REPO / "build" / "bin"


def salus_env() -> dict[str, str]:
    """This environment with $SALUS_LD_LIBRARY_PATH put first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    extra = os.environ.get("SALUS_LD_LIBRARY_PATH", "")
    if extra:
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (extra, env.get("LD_LIBRARY_PATH", "")) if p)
    return env
MODELS = REPO / "benchmarks" / "models"
PROFILES = REPO / "benchmarks" / "workloads" / "salus-p100-profiles.csv"
TRACES = REPO / "benchmarks" / "traces"

# How long a daemon may take to log its ready line, and to drain after SIGTERM.
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
MIB = 1024 * 1024

_READY = re.compile(r"event: ready (\{.*\})")


_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(text: str) -> int:
    """"16GiB" -> 17179869184, as the daemon reads --memory."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"not a byte size: {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


# -- the reference models -------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """A model in benchmarks/models: its inputs (per-sample shape and dtype) and its loss."""

    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape without batch, dtype)
    loss: str = "loss"

    @property
    def path(self) -> Path:
        return MODELS / f"{self.name}.onnx"

    def shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        return {n: (batch, *s) for n, (s, _) in self.inputs.items()}

    def feeds(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Seeded synthetic data: floats standard normal, int64 labels in [0, 10)."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for n, (s, dtype) in self.inputs.items():
            if dtype == "int64":
                out[n] = rng.integers(0, 10, size=(batch, *s), dtype=np.int64)
            else:
                out[n] = rng.standard_normal((batch, *s), dtype=np.float32)
        return out

    def run_args(self, batch: int) -> list[str]:
        """salus-run's --input flags."""
        return [f"--input={n}={','.join(str(d) for d in s)}" for n, s in self.shapes(batch).items()]


MODEL_SPECS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", {"x": ((784,), "float32"), "labels": ((), "int64")}),
    "lenet5": ModelSpec("lenet5", {"x": ((1, 28, 28), "float32"), "labels": ((), "int64")}),
    "resnet": ModelSpec("resnet", {"x": ((3, 32, 32), "float32"), "labels": ((), "int64")}),
    "espcn": ModelSpec(
        "espcn", {"x": ((1, 16, 16), "float32"), "target": ((1, 48, 48), "float32")}
    ),
    "vae": ModelSpec("vae", {"x": ((784,), "float32"), "eps": ((20,), "float32")}),
}


# -- the daemon -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """A salus-server this process started; stop() (or leaving the `with`) drains it.

    It logs at level info, since its `event: ready` line (how we know it serves) is an info
    line; the log goes to `log_path`."""

    def __init__(self, policy: str, memory: str = "4GiB",
                 policy_options: dict[str, Any] | None = None,
                 log_path: Path | None = None, device: str = "cpu") -> None:
        binary = BIN / "salus-server"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run scripts/build first")
        # ipc: clients on this host then stage feeds in shared memory, which the daemon maps
        # only for a client whose Unix user it knows (docs/operations.md, Shared buffers).
        self._dir = tempfile.mkdtemp(prefix="salus-bench-")
        self.endpoint = f"ipc://{self._dir}/salus.sock"
        cmd = [str(binary), "--listen", self.endpoint, "--memory", memory, "--policy", policy,
               "--log-level", "info", "--metrics-listen", f"127.0.0.1:{free_port()}",
               "--device", device]
        if policy_options:
            cmd += ["--policy-options", json.dumps(policy_options)]
        self.policy = policy
        self._warned = False
        self._log = open(log_path, "a") if log_path else None  # closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=salus_env())
        self.ready: dict[str, Any] = {}
        got_ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(got_ready,), daemon=True)
        self._reader.start()
        if not got_ready.wait(READY_TIMEOUT_S) or not self.ready:
            self.stop()
            raise RuntimeError(f"salus-server did not become ready: {' '.join(cmd)}")

    def _read(self, got_ready: threading.Event) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if self._log:
                self._log.write(line)
            if not self.ready:
                m = _READY.search(line)
                if m:
                    self.ready = json.loads(m.group(1))
                    got_ready.set()
        got_ready.set()  # the daemon exited before it was ready

    def stop(self) -> int:
        """SIGTERM, wait for the drain, SIGKILL if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        if self._log:
            self._log.close()
            self._log = None
        shutil.rmtree(self._dir, ignore_errors=True)
        rc = int(self.proc.returncode)
        if rc != 0 and not self._warned:
            self._warned = True
            print(f"warning: salus-server ({self.policy}) exited with status {rc} when stopped; "
                  "see its log", file=sys.stderr)
        return rc

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def device(args: argparse.Namespace, policy: str, memory: str = "4GiB",
           policy_options: dict[str, Any] | None = None) -> Iterator[str]:
    """The endpoint to run on: --endpoint as given, or a fresh daemon with this policy."""
    if args.endpoint:
        yield args.endpoint
        return
    with Daemon(policy, memory, policy_options, log_path=args.out / "salus-server.log",
                device=getattr(args, "device", "cpu")) as d:
        yield d.endpoint


def server_policy(endpoint: str) -> str:
    import salus

    c = salus.connect(endpoint)
    try:
        return str(c.server["policy"])
    finally:
        c.close()


# -- outputs ----------------------------------------------------------------------------------
def out_dir(experiment: str, given: Path | None) -> Path:
    if given is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        given = REPO / "results" / f"{experiment}-{stamp}"
    given.mkdir(parents=True, exist_ok=True)
    return given


def write_csv(path: Path, rows: Sequence[dict[str, Any]],
              fields: Sequence[str] | None = None) -> None:
    if fields is None:
        fields = list(rows[0].keys()) if rows else []
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in fields})


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def md_table(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(fields) + " |", "|" + " --- |" * len(fields)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in fields) + " |" for r in rows]
    return "\n".join(lines)


def write_report(out: Path, title: str, args: argparse.Namespace, sections: list[str],
                 wall_s: float) -> None:
    def shown(v: Any) -> str:
        if isinstance(v, Path) and v.is_absolute() and v.is_relative_to(REPO):
            return str(v.relative_to(REPO))
        return str(v)

    params = {k: shown(v) for k, v in sorted(vars(args).items()) if k not in ("func", "out")}
    head = [
        f"# {title}",
        "",
        f"Run {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} on "
        f"{os.cpu_count()} CPU cores, device {getattr(args, 'device', 'cpu')}; wall time "
        f"{wall_s:.1f} s.",
        "",
        "Parameters: " + ", ".join(f"`{k}={v}`" for k, v in params.items()),
        "",
    ]
    (out / "report.md").write_text("\n".join(head + sections) + "\n")


def plt_figure() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


# -- sessions on the reference models -------------------------------------------------------
@dataclass
class IterationRecord:
    """One iteration as the client saw it; times in seconds since the experiment's t0."""

    job: str
    index: int
    sent_s: float
    end_s: float
    run_s: float
    queue_delay_s: float
    switch_gap_s: float
    lane: int

    @property
    def start_s(self) -> float:
        """When the device started it: the reply's arrival less the run time."""
        return self.end_s - self.run_s

    def row(self) -> dict[str, Any]:
        return {"job": self.job, "iteration": self.index, "sent_s": self.sent_s,
                "start_s": self.start_s, "end_s": self.end_s, "run_ms": self.run_s * 1e3,
                "queue_delay_ms": self.queue_delay_s * 1e3,
                "switch_gap_ms": self.switch_gap_s * 1e3, "lane": self.lane}


ITERATION_FIELDS = ["job", "iteration", "sent_s", "start_s", "end_s", "run_ms",
                    "queue_delay_ms", "switch_gap_ms", "lane"]


def open_model_session(client: Any, model: str, batch: int, mode: str = "train",
                       iterations: int = 0, name: str = "", priority: int = 0,
                       duration: float = 0.0, latency_class: str = "batch") -> Any:
    """A session on a reference model; `duration` (seconds of device time) and `iterations`
    declare its length to the scheduler, `latency_class` is "batch" or "interactive"."""
    spec = MODEL_SPECS[model]
    return client.create_session(
        model=spec.path, mode=mode, inputs=spec.shapes(batch),
        loss=spec.loss if mode == "train" else "",
        optimizer={"type": "sgd", "lr": 0.05} if mode == "train" else None,
        iterations=iterations, duration=duration, name=name or model, priority=priority,
        latency_class=latency_class)


def timed_run(session: Any, feeds: dict[str, np.ndarray], fetches: list[str], job: str,
              index: int, t0: float) -> IterationRecord:
    sent = time.monotonic()
    session.run(feeds=feeds, fetches=fetches)
    end = time.monotonic()
    st = session.last_stats
    return IterationRecord(job, index, sent - t0, end - t0, st.run_us / 1e6,
                           st.queue_delay_us / 1e6, st.switch_gap_us / 1e6, st.lane)


def calibrate(endpoint: str, model: str, batch: int, iterations: int = 5,
              mode: str = "train") -> float:
    """Median seconds per iteration of the model alone on the daemon (after one warm-up)."""
    import salus

    spec = MODEL_SPECS[model]
    feeds = spec.feeds(batch, seed=0)
    c = salus.connect(endpoint, timeout=None)
    try:
        s = open_model_session(c, model, batch, mode=mode, name=f"calibrate-{model}")
        s.run(feeds=feeds)
        times = []
        for _ in range(iterations):
            t = time.monotonic()
            s.run(feeds=feeds)
            times.append(time.monotonic() - t)
        s.close()
        return median(times)
    finally:
        c.close()


def run_threads(targets: list[Any]) -> list[BaseException]:
    """Runs callables on threads, waits for all; returns what they raised."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def wrap(fn: Any) -> None:
        try:
            fn()
        except BaseException as e:  # handed to the caller
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=wrap, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
