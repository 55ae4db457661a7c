"""`cmake --install` of the release build (into a DESTDIR): the binaries, a systemd unit whose
paths point at them and at the installed config, the config itself (kept when one is there
already) and the documentation the unit names; the installed daemon accepts the installed
config under every policy."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"


def install(dest: Path) -> None:
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", "/usr/local"], check=True,
                   env=dict(os.environ, DESTDIR=str(dest)), capture_output=True, timeout=300)


def test_install_lays_out_a_service(tmp_path: Path) -> None:
    install(tmp_path)
    prefix = tmp_path / "usr" / "local"
    for binary in ["salus-server", "salusctl", "salus-devices", "salus-run", "salus-sim"]:
        assert os.access(prefix / "bin" / binary, os.X_OK), binary
    unit = (prefix / "lib" / "systemd" / "system" / "salus-server.service").read_text()
    assert "@" not in unit.replace("multi-user", "")  # every placeholder filled in
    exec_start = re.search(r"^ExecStart=(\S+) --config (\S+) --state-dir (\S+)$", unit, re.M)
    assert exec_start is not None, unit
    assert exec_start.group(1) == "/usr/local/bin/salus-server"
    config = exec_start.group(2)
    assert (tmp_path / config.lstrip("/")).is_file()
    # Sessions outlive a restart: the state directory systemd makes for the service.
    assert exec_start.group(3) == "/var/lib/salus"
    assert re.search(r"^StateDirectory=salus$", unit, re.M), unit
    docs = re.search(r"^Documentation=file://(\S+)$", unit, re.M).group(1)
    assert (tmp_path / docs.lstrip("/")).is_file()
    assert (prefix / "share" / "doc" / "salus" / "CHANGELOG.md").is_file()
    server = prefix / "bin" / "salus-server"
    for policy in ["fifo", "srtf", "pack", "fair", "priority"]:
        r = subprocess.run([str(server), "--config", str(tmp_path / config.lstrip("/")),
                            "--policy", policy, "--check-config"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, (policy, r.stderr)


def test_an_edited_config_survives_a_reinstall(tmp_path: Path) -> None:
    install(tmp_path)
    config = tmp_path / "etc" / "salus" / "salus.json"
    config.write_text('{"policy": "pack"}\n')
    install(tmp_path)
    assert config.read_text() == '{"policy": "pack"}\n'
