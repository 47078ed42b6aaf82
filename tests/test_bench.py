"""Every benchmark still runs, as on a fresh clone: each at a tiny size (``--tiny``: the sample
notes for the shared corpus, the fake Ollama for a model), in seconds, writing its results apart
from the recorded ones. A moved module or a renamed call fails here, not when someone next
measures. And docs/performance.md lists every benchmark there is."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = REPO / "bench"
HELPERS = {"common", "run"}  # what the benchmarks share, and the runner (checked below)
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.stem not in HELPERS)


def test_there_are_benchmarks_and_the_runner_knows_each():
    assert len(SCRIPTS) >= 10  # the glob sees them (a check that cannot fail is no check)
    listed = subprocess.run([sys.executable, str(BENCH / "run.py"), "--list"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert names == {p.stem for p in SCRIPTS} - {"related_links"}


def test_the_docs_list_every_benchmark():
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    missing = [p.name for p in SCRIPTS if f"bench/{p.name}" not in text]
    assert missing == []


def recorded() -> dict[str, str]:
    """What is tracked in bench/ (the recorded results, the scripts), by its content."""
    tracked = subprocess.run(["git", "ls-files", "bench"], capture_output=True, text=True, cwd=REPO).stdout.split()
    return {name: hashlib.sha256((REPO / name).read_bytes()).hexdigest() for name in tracked if (REPO / name).exists()}


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_benchmark_runs_at_a_tiny_size_and_leaves_the_recorded_results(script, tmp_path):
    before = recorded()
    env = {**os.environ, "LEANOTE_RAG_BENCH_OUT": str(tmp_path / "results")}
    env.pop("LEANOTE_RAG_SHARED", None)  # as on a fresh clone: no shared corpus
    done = subprocess.run([sys.executable, str(script), "--tiny"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=600)
    assert done.returncode == 0, f"{script.name} --tiny failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{script.name} --tiny printed nothing"
    assert recorded() == before, "a tiny run changed what bench/ records"
