"""The Python client's build: its wire-protocol modules (salus/_generated) are generated from the
project's .proto files (../../proto) when the package is built, so `pip install adaptors/python`
and `python -m build adaptors/python` need no CMake build first. An sdist carries the generated
modules, so a wheel built from it needs no .proto files. protoc is grpcio-tools' (a build
requirement in pyproject.toml): protoc 3.21, whose modules load on protobuf 4.21 and later.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
OUT = HERE / "salus" / "_generated"
# (import root, .proto files under it): the wire protocol, and the kubelet's APIs for
# salus-device-plugin.
PROTOS = ["salus/v1/salus.proto", "salus/v1/aten_graph.proto",
          "k8s/deviceplugin_v1beta1.proto", "k8s/podresources_v1.proto"]


def generate() -> None:
    outputs = [OUT / p.replace(".proto", "_pb2.py") for p in PROTOS]
    if not PROTO_ROOT.is_dir():
        if all(o.is_file() for o in outputs):
            return  # an sdist: generated when it was made
        raise SystemExit(f"salus: neither {PROTO_ROOT} nor the generated modules in {OUT} exist")
    sources = [PROTO_ROOT / p for p in PROTOS]
    newest = max(s.stat().st_mtime for s in sources)
    if all(o.is_file() and o.stat().st_mtime >= newest for o in outputs):
        return
    from grpc_tools import protoc

    OUT.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"--proto_path={PROTO_ROOT}", f"--python_out={OUT}", *map(str, sources)]
    if protoc.main(args) != 0:
        raise SystemExit(f"salus: protoc failed on {', '.join(PROTOS)}")


class BuildPy(build_py):
    def run(self) -> None:
        generate()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        generate()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
