"""The Python client installs the way a user installs it, without a CMake build: from a copy of
the checkout that holds only the .proto files and the package (no generated modules), `python
-m build` makes an sdist and, from that sdist alone, a wheel; the wheel installs into a clean
virtual environment, imports, carries the project's version and talks the wire protocol."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path | None = None) -> str:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_the_client_builds_and_installs_without_cmake(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "proto", checkout / "proto")
    shutil.copytree(REPO / "adaptors" / "python", checkout / "adaptors" / "python",
                    ignore=shutil.ignore_patterns("_generated", "*.egg-info", "__pycache__"))
    package = checkout / "adaptors" / "python"
    dist = tmp_path / "dist"
    # `python -m build`: the sdist, then the wheel from the unpacked sdist alone (no .proto
    # files there).
    run(sys.executable, "-m", "build", "--outdir", str(dist), str(package))
    assert len(list(dist.glob("salus-*.tar.gz"))) == 1
    wheels = list(dist.glob("salus-*.whl"))
    assert len(wheels) == 1

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    run(str(python), "-m", "pip", "install", "-q", str(wheels[0]))
    out = run(str(python), "-c",
              "import salus, salus.client as c; "
              "from salus._generated.salus.v1 import salus_pb2 as pb; "
              "r = pb.Request(); r.hello.protocol_version = salus.PROTOCOL_VERSION; "
              "print(salus.__version__, len(r.SerializeToString()))", cwd=tmp_path)
    version, size = out.split()
    import salus
    assert version == salus.__version__
    assert int(size) > 0
