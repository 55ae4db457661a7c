"""How long does the daemon take to compile a model of N nodes, and what does it hold then?

Creates inference sessions of ONNX chains of N Relu nodes (a model whose cost is all in its
node count) on a fresh daemon (build/bin/salus-server) whose node limit is lifted, one N at a
time, and prints the seconds from CreateSession to its reply and the daemon's peak RSS after
each. Compile time should grow linearly with N (limits.max_nodes bounds it in service;
docs/operations.md, Limits).

    .venv/bin/python benchmarks/security/compile_nodes.py [--nodes 12500 25000 ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "adaptors" / "python"))

import salus  # noqa: E402


def chain(n: int) -> bytes:
    names = ["x"] + [f"r{i}" for i in range(n)]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(n)]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[12_500, 25_000, 50_000, 100_000,
                                                            200_000, 300_000])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="salus-compile-") as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps({"limits": {"max_nodes": max(args.nodes),
                                                 "compile_seconds": 0}}))
        endpoint = f"ipc://{folder}/salus.sock"
        daemon = subprocess.Popen([str(REPO / "build" / "bin" / "salus-server"), "--listen",
                                   endpoint, "--memory", "1GiB", "--config", str(config)],
                                  stderr=subprocess.PIPE, text=True)
        try:
            assert daemon.stderr is not None
            for line in daemon.stderr:
                if "event: ready " in line:
                    break
            else:
                raise SystemExit("salus-server exited before it was ready")
            c = salus.connect(endpoint, timeout=None)
            for n in args.nodes:
                model = chain(n)
                start = time.monotonic()
                try:
                    s = c.create_session(model=model, mode="infer", inputs={"x": (4,)})
                    row = {"nodes": n, "model_bytes": len(model),
                           "seconds": round(time.monotonic() - start, 3)}
                    s.close()
                except salus.SalusError as e:
                    row = {"nodes": n, "refused": e.code, "message": e.message[:120]}
                row["peak_rss_mib"] = peak_rss(daemon.pid) >> 20
                print(json.dumps(row), flush=True)
            c.close()
        finally:
            daemon.terminate()
            daemon.wait()

if __name__ == "__main__":
    main()
