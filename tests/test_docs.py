"""The documentation: the README is a front page, the site builds strictly, and every
config it shows is one leanote-rag accepts."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from rag.config import Settings, from_dict

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
_YAML = re.compile(r"^( *)```ya?ml\n(.*?)^\1```", re.M | re.S)
_HEREDOC = re.compile(r"^cat > (\S+\.ya?ml) <<'EOF'\n(.*?)^EOF$", re.M | re.S)


def config_blocks(path: Path) -> list[dict]:
    """The YAML blocks of a page that are configs (their keys are config sections), and
    the configs its shell blocks write with a here-document."""
    text = path.read_text(encoding="utf-8")
    found = [m.group(2) for m in _HEREDOC.finditer(text)]
    for m in _YAML.finditer(text):
        found.append("\n".join(line[len(m.group(1)):] for line in m.group(2).splitlines()))
    out = []
    for body in found:
        raw = yaml.safe_load(body)
        if isinstance(raw, dict) and set(raw) <= set(Settings.model_fields):
            out.append(raw)
    return out


def test_the_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    quick = re.findall(r"^## Quick start: (.+)$", text, re.M)
    assert quick == ["a folder of Markdown notes", "your Leanote server", "Telegram in five steps"]
    # every page of the site is linked from it, and every link to docs/ has its page
    linked = set(re.findall(r"\]\(docs/([\w\-]+\.md)\)", text))
    assert linked == {p.name for p in PAGES}


def test_every_config_shown_is_accepted(tmp_path):
    blocks = {path.name: config_blocks(path) for path in [README, *PAGES]}
    complete = [b for b in blocks["README.md"] if (b.get("source") or {}).get("kind") == "leanote_api"]
    assert complete, "the README's Leanote quick start shows a complete config"
    assert any((b.get("source") or {}).get("kind") == "files" for b in blocks["README.md"])
    checked = 0
    for name, configs in blocks.items():
        for raw in configs:
            # a fragment (a section or two) is read as it would be used: added to that complete config
            whole = raw if "source" in raw else {**complete[0], **raw}
            from_dict(whole, base_dir=tmp_path)  # raises, naming the key, when the docs show a wrong one
            checked += 1
    assert checked >= 10


def strict_build(folder: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the site whose mkdocs.yml is in ``folder``; skips without the docs extra."""
    for module in ("mkdocs", "material"):
        pytest.importorskip(module, reason="the docs extra is not installed (make test installs it): pip install -e '.[docs]'")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    run = strict_build(REPO, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "answers" / "index.html").exists()


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
    # the strict build is what catches it: a copy of the docs with one bad link and one page left out of the nav
    docs = tmp_path / "docs"
    docs.mkdir()
    for page in PAGES:
        (docs / page.name).write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    with (docs / "index.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](nowhere.md).\n")
    (docs / "stray.md").write_text("# Not in the nav\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text((REPO / "mkdocs.yml").read_text(encoding="utf-8"), encoding="utf-8")
    run = strict_build(tmp_path, tmp_path / "site")
    assert run.returncode != 0
    assert "nowhere.md" in run.stderr and "stray.md" in run.stderr
