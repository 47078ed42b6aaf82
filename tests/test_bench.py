"""Every bench script still fits the code: each imports (what it imports of ours exists) and
says how it is run (``--help``), as on a fresh clone. A moved module or a renamed call fails
here, not when someone next measures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

SCRIPTS = sorted((REPO / "bench").glob("*.py"))


def test_there_are_bench_scripts():
    assert len(SCRIPTS) >= 20  # the glob sees them (a check that cannot fail is no check)


@pytest.mark.slow
def test_every_bench_script_imports_and_says_how_it_is_run():
    """All of them in one child process (one interpreter start), each run as a script with
    ``--help``: it imports what it needs and prints its usage."""
    probe = r'''
import contextlib, io, runpy, sys
failed = []
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1][:-3]
    out = io.StringIO()
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        failed.append((name, "ran instead of printing its usage"))
    except SystemExit as done:
        if done.code not in (0, None) or "usage" not in out.getvalue().lower():
            failed.append((name, f"exit {done.code}: {out.getvalue()[:200]}"))
    except BaseException as err:
        failed.append((name, repr(err)[:300]))
print(repr(failed))
'''
    done = subprocess.run([sys.executable, "-c", probe, *map(str, SCRIPTS)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-3000:]
