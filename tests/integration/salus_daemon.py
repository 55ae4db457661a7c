"""A real salus-server child process on loopback, for the integration tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(os.environ.get("SALUS_SERVER", REPO / "build" / "bin" / "salus-server"))
MODELS = REPO / "benchmarks" / "models"
sys.path.insert(0, str(REPO / "adaptors" / "python"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A salus-server child process; `endpoint` is its tcp endpoint."""

    def __init__(self, *args: str, memory: str = "1GiB", policy: str = "fair",
                 lease: float = 30.0) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        cmd = [str(SERVER), "--listen", self.endpoint, "--memory", memory, "--policy", policy,
               "--lease-seconds", str(lease), "--metrics-listen",
               f"127.0.0.1:{self.metrics_port}", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.ready: dict = {}
        deadline = time.monotonic() + 20
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"salus-server exited early with {self.proc.wait()}")
            if "event: ready " in line:
                self.ready = json.loads(line.split("event: ready ", 1)[1])
                break
        else:
            self.proc.kill()
            raise RuntimeError("salus-server did not become ready")
        # Keep draining stderr so the daemon never blocks on a full pipe.
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
