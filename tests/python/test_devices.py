"""The salus-devices tool: it must run on any machine and say whether a GPU is usable."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def test_json_lists_cpu_and_cuda_state(bin_dir: Path) -> None:
    out = subprocess.run(
        [str(bin_dir / "salus-devices"), "--json"], check=True, capture_output=True, text=True
    ).stdout
    info = json.loads(out)
    assert info["cpu"]["available"] is True
    assert info["cpu"]["threads"] >= 1
    cuda = info["cuda"]
    if cuda["devices"]:
        assert cuda["reason"] == ""
        assert all(d["total_bytes"] > 0 for d in cuda["devices"])
    else:
        assert cuda["reason"].startswith("no GPU")


def test_bad_flag_is_a_usage_error(bin_dir: Path) -> None:
    res = subprocess.run(
        [str(bin_dir / "salus-devices"), "--no-such-flag"], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "no-such-flag" in res.stderr
