"""The Prometheus alert rules (compose/prometheus/alerts.yml) and the Grafana dashboard: they
name only metrics rlstream declares, the rules parse, and promtool's unit tests
(alerts.test.yml) fire and stay quiet as meant."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import rlstream.metrics  # noqa: F401  (declares every metric on the default registry)

COMPOSE = Path(__file__).parents[2] / "compose"
RULES = COMPOSE / "prometheus"
DASHBOARD = COMPOSE / "grafana" / "provisioning" / "dashboards" / "rlstream.json"


def exposed_names() -> set[str]:
    """Series names the default registry's metrics expose, labelled ones included (a counter
    family `x` exposes `x_total`)."""
    return {m.name + ("_total" if m.type == "counter" else "") for m in REGISTRY.collect()}


def test_alerts_name_only_declared_metrics():
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    used = {n for r in rules for n in re.findall(r"rlstream_\w+", r["expr"])}
    assert used, "the rules should watch rlstream's own metrics"
    missing = used - exposed_names()
    assert not missing, f"alerts.yml names undeclared metrics: {sorted(missing)}"
    config = yaml.safe_load((RULES / "prometheus.yml").read_text())
    assert "alerts.yml" in config["rule_files"]


def test_dashboard_panels_query_only_declared_metrics():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"rlstream_\w+", e)}
    assert len(panels) >= 8 and used
    missing = used - exposed_names()
    assert not missing, f"the dashboard queries undeclared metrics: {sorted(missing)}"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/install.sh installs it (apt prometheus)")
        pytest.skip("promtool not installed (bash scripts/install.sh installs it)")
    return path


@pytest.mark.parametrize(
    "args", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]]
)
def test_promtool_accepts_and_unit_tests_the_rules(args):
    out = subprocess.run([promtool(), *args], cwd=RULES, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
