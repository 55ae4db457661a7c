"""One version: CMakeLists.txt defines the project's version and the wire protocol's; every
binary reports them (--version) and every Python package carries the same."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "build" / "bin"
sys.path.insert(0, str(REPO / "adaptors" / "python"))


def cmake_versions() -> tuple[str, int]:
    text = (REPO / "CMakeLists.txt").read_text()
    version = re.search(r"project\(salus VERSION (\S+)", text).group(1)
    protocol = int(re.search(r"set\(SALUS_PROTOCOL_VERSION (\d+)\)", text).group(1))
    return version, protocol


@pytest.mark.parametrize("binary", ["salus-server", "salusctl", "salus-devices", "salus-run",
                                    "salus-sim"])
def test_every_binary_reports_the_version_and_protocol(binary: str) -> None:
    version, protocol = cmake_versions()
    out = subprocess.run([str(BIN / binary), "--version"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    first, devices = out.splitlines()[:2]
    assert first == f"{binary} {version} (protocol {protocol})"
    # What the binary runs on: a CPU-only build says so, a CUDA build names its toolkit.
    assert devices == "devices: cpu (built without CUDA)" or devices.startswith(
        "devices: cpu, cuda (CUDA ")


def test_python_packages_carry_the_projects_version() -> None:
    version, protocol = cmake_versions()
    for pyproject in ["adaptors/python/pyproject.toml", "adaptors/pytorch/pyproject.toml",
                      "adaptors/tensorflow/python/pyproject.toml"]:
        assert tomllib.loads((REPO / pyproject).read_text())["project"]["version"] == version, \
            pyproject
    for module in ["adaptors/pytorch/salus_torch/__init__.py",
                   "adaptors/tensorflow/python/salus_tensorflow/__init__.py",
                   "adaptors/python/salus/__init__.py"]:
        assert f'__version__ = "{version}"' in (REPO / module).read_text(), module
    import salus
    assert salus.__version__ == version
    assert salus.PROTOCOL_VERSION == protocol
