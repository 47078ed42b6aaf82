"""The systemd units: they parse, run the installed command, are hardened (checked with
systemd-analyze where it exists) and keep the daemon's promises (stop, restart, memory)."""

import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO

UNITS = sorted((REPO / "systemd").glob("*.service")) + sorted((REPO / "systemd").glob("*.timer"))
SERVICES = ["leanote-rag.service", "leanote-rag-index.service"]
INSTALLED = "/opt/leanote-rag/.venv/bin/leanote-rag"
needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze not installed")


def directives(unit: str) -> dict[str, list[str]]:
    """Key -> values in the order given, comments left out."""
    found: dict[str, list[str]] = {}
    for line in (REPO / "systemd" / unit).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def runnable_here(unit) -> str:
    """The unit with ExecStart pointing at a binary that exists here, everything else kept."""
    return unit.read_text().replace(INSTALLED, "/bin/true")


@pytest.mark.parametrize("unit, command", [("leanote-rag.service", "serve"), ("leanote-rag-index.service", "index")])
def test_units_run_the_installed_command_hardened(unit, command):
    service = (REPO / "systemd" / unit).read_text()
    assert re.search(rf"^ExecStart={re.escape(INSTALLED)} {command}$", service, re.M)
    d = directives(unit)
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("StateDirectory", "leanote-rag"), ("DynamicUser", "yes"), ("CapabilityBoundingSet", ""),
                       ("AmbientCapabilities", ""), ("PrivateUsers", "yes"), ("UMask", "0077"),
                       ("ProtectProc", "invisible"), ("RestrictNamespaces", "yes"), ("PrivateDevices", "yes"),
                       ("SystemCallArchitectures", "native"), ("SystemCallErrorNumber", "EPERM")]:
        assert d.get(key) == [value], key
    assert d["ProtectHome"] and d["EnvironmentFile"]
    assert d["SystemCallFilter"][:2] == ["@system-service", "~@privileged @resources"]
    assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    # torch's oneDNN compiles kernels at run time (W^X would fail every model call) and reads
    # /proc/cpuinfo to pick them (subset=pid would make it slow): both stay off
    assert "MemoryDenyWriteExecute" not in d and "ProcSubset" not in d
    assert re.fullmatch(r"\d+(\.\d+)?[KMGT]", d["MemoryMax"][0])


def test_the_daemon_may_open_more_files_than_systemds_default():
    """A stranger's connections are capped at a quarter of the file limit (bot.api.guard):
    at systemd's default 1,024 that is few; the unit raises it."""
    assert int(directives("leanote-rag.service")["LimitNOFILE"][0]) >= 16384


def test_the_daemon_restarts_on_failure_but_not_on_a_config_error():
    d = directives("leanote-rag.service")
    assert d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["2"]  # the CLI's exit status for a configuration error


def test_systemd_waits_for_the_daemons_promised_stop_but_not_much_longer():
    d = directives("leanote-rag.service")
    assert d["KillSignal"] == ["SIGTERM"]
    seconds = re.fullmatch(r"(\d+)s?", d["TimeoutStopSec"][0])
    assert seconds and 10 < int(seconds.group(1)) <= 30  # the daemon stops within 10 s of SIGTERM


@needs_systemd_analyze
def test_systemd_analyze_verify(tmp_path):
    for unit in UNITS:
        (tmp_path / unit.name).write_text(runnable_here(unit))
    out = subprocess.run(["systemd-analyze", "verify", *[str(tmp_path / u.name) for u in UNITS]],
                         capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "leanote-rag" in line]
    assert problems == []


def exposure(output: str, unit: str) -> float:
    """The number in 'Overall exposure level for leanote-rag.service: 1.2 OK'."""
    found = re.search(rf"Overall exposure level for {re.escape(unit)}:\s*(\d+(?:\.\d+)?)", output)
    assert found, output[-2000:]
    return float(found.group(1))


def test_exposure_is_read_from_the_summary_line():
    assert exposure("  ✓ UMask= ...\n→ Overall exposure level for a.service: 1.2 OK 🙂\n", "a.service") == 1.2
    assert exposure("Overall exposure level for a.service: 10.0 UNSAFE 😨", "a.service") == 10.0


@needs_systemd_analyze
@pytest.mark.parametrize("unit", SERVICES)
def test_systemd_analyze_security_rates_the_unit_ok(unit, tmp_path):
    # The unit inside an empty root: drop-ins under this machine's /etc cannot change the result.
    units = tmp_path / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    (units / unit).write_text(runnable_here(REPO / "systemd" / unit))
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", f"--root={tmp_path}", "--no-pager", unit],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "SYSTEMD_COLORS": "0"})
    if "--offline" in out.stderr and re.search(r"unrecognized|unknown", out.stderr, re.I):
        pytest.skip("systemd-analyze too old for --offline (needs systemd 250)")
    assert exposure(out.stdout + out.stderr, unit) <= 2.5


def test_example_config_is_valid():
    from rag import config

    settings = config.load(REPO / "systemd" / "config.example.yaml")
    assert settings.source.kind == "leanote_api" and settings.exclude.tags == ["private"]


def test_the_daemon_speaks_systemds_notify_protocol_and_reloads():
    service = (REPO / "systemd" / "leanote-rag.service").read_text()
    for line in ("Type=notify", "NotifyAccess=main", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec="):
        assert re.search(rf"^{re.escape(line)}", service, re.M), line
