"""The systemd units parse (checked with systemd-analyze where it exists)."""

import re
import shutil
import subprocess

import pytest

from conftest import REPO

UNITS = sorted((REPO / "systemd").glob("*.service")) + sorted((REPO / "systemd").glob("*.timer"))


@pytest.mark.parametrize("unit, command", [("leanote-rag.service", "serve"), ("leanote-rag-index.service", "index")])
def test_units_run_the_installed_command_hardened(unit, command):
    service = (REPO / "systemd" / unit).read_text()
    assert re.search(rf"^ExecStart=/opt/leanote-rag/\.venv/bin/leanote-rag {command}$", service, re.M)
    for hardening in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=", "PrivateTmp=yes",
                      "StateDirectory=leanote-rag", "EnvironmentFile=", "DynamicUser=yes"):
        assert hardening in service


def test_the_daemon_restarts_on_failure():
    service = (REPO / "systemd" / "leanote-rag.service").read_text()
    assert "Restart=on-failure" in service


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    for unit in UNITS:
        # point ExecStart at a binary that exists here, keep everything else
        text = unit.read_text().replace("/opt/leanote-rag/.venv/bin/leanote-rag", "/bin/true")
        (tmp_path / unit.name).write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", *[str(tmp_path / u.name) for u in UNITS]],
                         capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "leanote-rag" in line]
    assert problems == []


def test_example_config_is_valid():
    from rag import config

    settings = config.load(REPO / "systemd" / "config.example.yaml")
    assert settings.source.kind == "leanote_api" and settings.exclude.tags == ["private"]
