"""/metrics against its reference (docs/metrics.md): parsed with prometheus_client's own parser,
every documented series is served with its documented type and nothing undocumented is; the
per-session series is off unless the config asks for it; the Grafana dashboard and the alert
rules of deploy/monitoring use documented series only."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "adaptors" / "python"))

from salus_daemon import Daemon  # noqa: E402

import salus  # noqa: E402

MiB = 1 << 20
PER_SESSION = "salus_mem_session_bytes"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented() -> dict[str, str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    table = text.split("<!-- metrics -->", 1)[1].split("<!-- /metrics -->", 1)[0]
    rows = re.findall(r"^\| `(salus_\w+)` \| (\w+) \|", table, re.M)
    assert len(rows) > 30
    return dict(rows)


def served(daemon: Daemon) -> tuple[dict[str, str], list]:
    """{series name: type} from /metrics (counters by their _total name), and every sample."""
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    families, samples = {}, []
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        families[name] = family.type
        samples += family.samples
    return families, samples


def with_a_session(daemon: Daemon) -> tuple[dict[str, str], list]:
    with salus.connect(daemon.endpoint) as c:
        s = c.create_session(synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB,
                                        "iteration_seconds": 0.0}, iterations=3)
        s.run()
        return served(daemon)


def test_every_served_series_is_documented_with_its_type() -> None:
    d = Daemon()
    try:
        families, samples = with_a_session(d)
    finally:
        d.stop()
    reference = documented()
    assert PER_SESSION not in families  # off by default
    assert not any("session" in s.labels for s in samples)
    assert set(families) == set(reference) - {PER_SESSION}
    for name, kind in families.items():
        assert reference[name] == kind, name


def test_per_session_series_are_served_when_the_config_asks() -> None:
    d = Daemon(config={"metrics_per_session": True})
    try:
        families, samples = with_a_session(d)
    finally:
        d.stop()
    assert families[PER_SESSION] == documented()[PER_SESSION]
    sessions = {s.labels["session"] for s in samples if s.name == PER_SESSION}
    assert len(sessions) == 1


def expressions() -> list[str]:
    rules = yaml.safe_load((REPO / "deploy" / "monitoring" / "alerts.yaml").read_text())
    exprs = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"]
            exprs.append(rule["expr"])
    dashboard = json.loads((REPO / "deploy" / "monitoring" / "grafana-dashboard.json").read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        exprs += [t["expr"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"]["query"])
    return exprs


def test_alerts_and_dashboard_use_documented_series() -> None:
    reference = documented()
    used = set()
    for expr in expressions():
        for name in re.findall(r"\bsalus_\w+", expr):
            base = name
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and name[: -len(suffix)] in reference:
                    base = name[: -len(suffix)]
            assert base in reference, f"{name} in {expr!r}"
            used.add(base)
    # What the docs promise to watch: memory, queue, admission waits, latency, errors, device.
    for name in ["salus_mem_region_bytes", "salus_mem_admission_queue",
                 "salus_mem_admission_waits_total", "salus_sched_queue_delay_seconds",
                 "salus_sched_iteration_seconds", "salus_server_request_errors_total",
                 "salus_device_lost"]:
        assert name in used, name
