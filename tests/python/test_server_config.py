"""`salus-server --check-config`: the config a daemon would start with, checked without starting
one. Every shipped config is valid under every policy; a misspelt key anywhere is refused with
the key, where it was, and the key meant (Note [Config mistakes])."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "build" / "bin" / "salus-server"
POLICIES = ["fifo", "srtf", "pack", "fair", "priority"]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SERVER), "--check-config", *args], capture_output=True, text=True,
                          timeout=30)


def shipped_configs(tmp_path: Path) -> list[Path]:
    """docker/salus.json, and the config the Kubernetes manifests mount."""
    configs = [REPO / "docker" / "salus.json"]
    manifest = (REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text()
    body = manifest.split("salus.json: |", 1)[1]
    lines = [line[4:] for line in body.splitlines() if line.startswith("    ") or not line]
    k8s = tmp_path / "configmap-salus.json"
    k8s.write_text("\n".join(lines))
    json.loads(k8s.read_text())  # the manifest holds JSON
    configs.append(k8s)
    return configs


@pytest.mark.parametrize("policy", POLICIES)
def test_every_shipped_config_is_valid_under_every_policy(policy: str, tmp_path: Path) -> None:
    for config in shipped_configs(tmp_path):
        r = check("--config", str(config), "--policy", policy)
        assert r.returncode == 0, f"{config} under {policy}: {r.stderr}"
        assert f"policy {policy}" in r.stdout


def write(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "salus.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(("config", "key", "meant"), [
    ({"metrics-listen": "127.0.0.1:9464"}, "metrics-listen", "metrics_listen"),
    ({"polcy": "fair"}, "polcy", "policy"),
    ({"security": {"curve": {"secret_key": "k"}}}, "secret_key", "secret_key_file"),
    ({"limits": {"max_constant_byte": 1}}, "max_constant_byte", "max_constant_bytes"),
    ({"quotas": {"session": 4}}, "session", "sessions"),
    ({"policy": "fair", "policy_options": {"single_lanes": True}}, "single_lanes", "single_lane"),
])
def test_a_misspelt_key_is_refused_with_the_key_meant(tmp_path: Path, config: dict, key: str,
                                                      meant: str) -> None:
    r = check("--config", write(tmp_path, config))
    assert r.returncode == 1
    assert re.search(rf"unknown (key|limit|quota|option) .{re.escape(key)}.", r.stderr), r.stderr
    assert f"did you mean '{meant}'?" in r.stderr, r.stderr


def test_per_policy_options_apply_to_the_chosen_policy_only(tmp_path: Path) -> None:
    path = write(tmp_path, {"policy_options": {"fair": {"single_lane": True}}})
    for policy in POLICIES:
        assert check("--config", path, "--policy", policy).returncode == 0, policy
    # The flat form is the chosen policy's own options: FAIR's option is refused by SRTF.
    flat = write(tmp_path, {"policy": "srtf", "policy_options": {"single_lane": True}})
    r = check("--config", flat)
    assert r.returncode == 1
    assert "policy 'srtf': unknown option 'single_lane'" in r.stderr


def test_bad_values_are_refused_by_name(tmp_path: Path) -> None:
    r = check("--config", write(tmp_path, {"device": "tpu:0"}))
    assert r.returncode == 1 and "tpu:0" in r.stderr
    r = check("--config", write(tmp_path, {"lease_seconds": -1}))
    assert r.returncode == 1 and "lease_seconds" in r.stderr
    r = check("--policy-options", "not json", "--policy", "fair")
    assert r.returncode == 1 and "policy_options" in r.stderr
    r = check("--config", str(tmp_path / "absent.json"))
    assert r.returncode == 1 and "absent.json" in r.stderr
