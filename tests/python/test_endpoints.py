"""Every client finds the daemon the same way (Note [Default endpoint] in
src/common/endpoints.h): `salusctl endpoint` (the C++ search, which the TensorFlow plugin and the
C++ client share) and the Python client's `salus.default_endpoint()` (which the PyTorch device
uses) agree, for each case of the search."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "adaptors" / "python"))
SALUSCTL = REPO / "build" / "bin" / "salusctl"

import salus  # noqa: E402

USER_TMP = Path(f"/tmp/salus-{os.getuid()}")
SYSTEM = Path("/run/salus/salus.sock")


def both(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    for key in ("SALUS_ENDPOINT", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cpp = subprocess.run([str(SALUSCTL), "endpoint"], capture_output=True, text=True,
                         timeout=30, check=True, env=dict(os.environ)).stdout.strip()
    return cpp, salus.default_endpoint()


def listening_socket(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.fixture
def no_other_daemons() -> None:
    if (USER_TMP / "salus.sock").exists() or SYSTEM.exists():
        pytest.skip("a daemon's socket exists on this machine; the search would find it")


def test_salus_endpoint_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    cpp, py = both({"SALUS_ENDPOINT": "tcp://10.0.0.1:6000"}, monkeypatch)
    assert cpp == py == "tcp://10.0.0.1:6000"


def test_without_a_local_socket_both_use_the_default_tcp_endpoint(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_other_daemons: None) -> None:
    cpp, py = both({"XDG_RUNTIME_DIR": str(tmp_path)}, monkeypatch)
    assert cpp == py == "tcp://127.0.0.1:5501"


def test_a_users_daemon_socket_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        no_other_daemons: None) -> None:
    sock = tmp_path / "salus" / "salus.sock"
    with listening_socket(sock):
        cpp, py = both({"XDG_RUNTIME_DIR": str(tmp_path)}, monkeypatch)
    assert cpp == py == f"ipc://{sock}"


def test_a_plain_file_is_not_a_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                      no_other_daemons: None) -> None:
    (tmp_path / "salus").mkdir()
    (tmp_path / "salus" / "salus.sock").write_text("not a socket")
    cpp, py = both({"XDG_RUNTIME_DIR": str(tmp_path)}, monkeypatch)
    assert cpp == py == "tcp://127.0.0.1:5501"


def test_a_daemon_started_without_xdg_runtime_dir_is_found(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_other_daemons: None) -> None:
    sock = USER_TMP / "salus.sock"
    try:
        with listening_socket(sock):
            cpp, py = both({"XDG_RUNTIME_DIR": str(tmp_path)}, monkeypatch)
    finally:
        sock.unlink(missing_ok=True)
    assert cpp == py == f"ipc://{sock}"
