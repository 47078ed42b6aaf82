"""Run benchmarks, each in a process of its own, and say how long each took.

    .venv/bin/python bench/run.py                   # the standard ones: index and search, the answer eval
    .venv/bin/python bench/run.py sync_changes bots # these (a script's name without .py)
    .venv/bin/python bench/run.py --all --tiny      # every benchmark, each at a tiny size (seconds each)
    .venv/bin/python bench/run.py --list            # what there is, and what each measures

``make bench`` runs this (``BENCH="…"`` names the benchmarks, ``TINY=1`` adds ``--tiny``).
docs/performance.md lists every benchmark with what it measures and how long a full run takes;
a full run needs the shared corpus (``../shared``, or ``$LEANOTE_RAG_SHARED``), a tiny run only
the sample notes. Any option after ``--`` goes to each benchmark.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
STANDARD = ("index_search", "answers_eval")
NOT_BENCHMARKS = {"common", "run", "related_links"}  # helpers (related_links: related's ground truth)


def benchmarks() -> dict[str, str]:
    """Every benchmark script, with the first line of its docstring."""
    out = {}
    for path in sorted(BENCH.glob("*.py")):
        if path.stem in NOT_BENCHMARKS:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out[path.stem] = " ".join(doc.split("\n\n")[0].split())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: {' '.join(STANDARD)})")
    ap.add_argument("--all", action="store_true", help="every benchmark")
    ap.add_argument("--tiny", action="store_true", help="each at a tiny size, on the sample notes")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and stop")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    known = benchmarks()
    if args.list:
        for name, what in known.items():
            print(f"{name:<16} {what}")
        return 0
    names = list(known) if args.all else (args.names or list(STANDARD))
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"no benchmark {', '.join(unknown)}; there are: {', '.join(known)}")
    took, failed = [], []
    for name in names:
        print(f"== {name}{' (tiny)' if args.tiny else ''}", flush=True)
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *(["--tiny"] if args.tiny else []), *extra])
        took.append((name, time.monotonic() - started, done.returncode))
        if done.returncode:
            failed.append(name)
    print()
    for name, seconds, code in took:
        print(f"{name:<16} {seconds:8.1f} s" + ("" if code == 0 else f"  FAILED (exit {code})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
