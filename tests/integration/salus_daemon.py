"""A real salus-server child process on loopback, for the integration tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(os.environ.get("SALUS_SERVER", REPO / "build" / "bin" / "salus-server"))
# salusctl of the same build as the server unless $SALUS_CTL names one.
CTL = Path(os.environ.get("SALUS_CTL", SERVER.parent / "salusctl"))
MODELS = REPO / "benchmarks" / "models"
sys.path.insert(0, str(REPO / "adaptors" / "python"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A salus-server child process. `endpoint` is its loopback tcp endpoint, where a client
    is an ordinary user; `admin_endpoint` its ipc socket in a private folder, where a client
    of this process's Unix user is an administrator. `config` is written to a file in that
    folder and passed as --config; `args` are further flags. `world_access` makes that folder
    0755, so that other Unix users can reach the ipc socket (which the daemon makes 0666), as
    they reach a system daemon's."""

    def __init__(self, *args: str, memory: str = "1GiB", policy: str = "fair",
                 lease: float = 30.0, config: dict | None = None,
                 world_access: bool = False, after: Daemon | None = None) -> None:
        # `after`: a daemon that exited, whose endpoints (and folder) this one takes over, as a
        # restarted daemon does; its clients reconnect to this one.
        self.port = after.port if after is not None else free_port()
        self.metrics_port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        if after is not None:
            after._remove_dir.detach()
            self.dir = after.dir
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="salus-test-"))
        self.admin_endpoint = f"ipc://{self.dir / 'salus.sock'}"
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self.dir, True)
        if world_access:
            os.chmod(self.dir, 0o755)
        cmd = [str(SERVER), "--listen", self.endpoint, "--listen", self.admin_endpoint,
               "--memory", memory, "--policy", policy, "--lease-seconds", str(lease),
               "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *args]
        if config is not None:
            path = self.dir / "config.json"
            path.write_text(json.dumps(config))
            cmd += ["--config", str(path)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.ready: dict = {}
        deadline = time.monotonic() + 20
        assert self.proc.stderr is not None
        early: list[str] = []  # what it said before it was ready, for the error below
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                self._remove_dir()
                said = "".join(early[-20:])
                raise RuntimeError(f"salus-server exited early with {self.proc.wait()}: {said}")
            early.append(line)
            if "event: ready " in line:
                self.ready = json.loads(line.split("event: ready ", 1)[1])
                break
        else:
            self.proc.kill()
            self._remove_dir()
            raise RuntimeError("salus-server did not become ready")
        # Keep draining stderr so the daemon never blocks on a full pipe.
        self.log: list[str] = early  # from its first line
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, timeout: float = 20, keep_dir: bool = False) -> int:
        """SIGTERM, and its exit status; `keep_dir` leaves its folder for a daemon started
        `after` it."""
        if keep_dir:
            self._remove_dir.detach()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._remove_dir()
