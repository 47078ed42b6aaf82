"""Ground truth for related notes: the corpus's own cross-links.

The shared corpus keeps the note bodies of their source repositories verbatim, including
relative Markdown links between files of the same repository (``[Redis 持久化](./redis-persistence.md)``;
in HTML notes rendered as ``<a href="./redis-persistence.md">``). Each note records its original path in
``Source`` (``owner/repo:path``), so such a link can be resolved to another note. Two notes that link to each
other this way are a pair a good "related notes" list should connect.

Resolution rules (see ``relative_path``, ``resolve_target``, ``candidates``; what the shared corpus used is noted):

1. Only relative links count: targets with a scheme (``https:``, ``mailto:`` ...), ``//host`` and pure
   anchors ``#x`` are skipped, as are images (``![alt](src)``, ``<img>``) and links inside code.
2. ``#fragment`` and ``?query`` are stripped, then the path is URL-decoded (HTML notes were rendered with
   markdown-it, which percent-encodes non-ASCII file names) and HTML entities are unescaped. On the shared
   corpus no resolving link carries a fragment, query or ``%`` escape (its Chinese-named links are all in
   Markdown notes, written raw); the rules are there for other notes.
3. The path is resolved against the directory of the linking note's ``Source`` path with ``posixpath.normpath``;
   a path starting with ``/`` is taken from the repository root.
4. The result is looked up among the ``Source`` paths of the same repository: exactly, then with ``.md``
   appended, then as ``<path>/README.md`` / ``<path>/index.md`` (a directory link). Matching is exact (case and
   Unicode as written). On the shared corpus 183 resolved links match exactly and one needs ``.md``
   (``./distributed-id-design``); README/index never match, as the corpus took no README/index pages.
5. A pair is kept only for two different notes of the same user that are both live (not trashed, not deleted).

Relative links that match no note (dead links, files the corpus did not take, links that leave the
repository) are reported as *unresolved*; links to a note that exists but is trashed/deleted, or belongs to
another user, are counted separately.

Run ``python bench/related_links.py`` to write ``bench/related_links.json`` and print the counts;
``python bench/related_links.py --tiny`` reads the sample notes instead (``bench/common.py``'s ``tiny_world``,
where two recipes link each other: one pair) and writes its JSON to a temporary folder.
"""

from __future__ import annotations

import argparse
import html
import json
import posixpath
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, results_file, shared, tiny_world  # noqa: E402

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?^[ \t]*\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
_HTML_CODE = re.compile(r"<(pre|code)\b[^>]*>.*?</\1\s*>", re.S | re.I)
_HTML_A = re.compile(r"<a\b([^>]*)>(.*?)</a\s*>", re.S | re.I)
_HREF = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
_TAG = re.compile(r"<[^>]+>")
_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class Link:
    """One relative link found in a note: its raw target and label."""

    target: str
    label: str


@dataclass
class Pair:
    """Two notes (``a < b`` by note id) of one user, linked in one or both directions."""

    a: str
    b: str
    user_id: str
    directions: list[str] = field(default_factory=list)  # "a->b" and/or "b->a"
    labels: dict[str, list[str]] = field(default_factory=dict)  # direction -> link labels
    titles: tuple[str, str] = ("", "")
    sources: tuple[str, str] = ("", "")

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "user_id": self.user_id,
            "directions": self.directions,
            "labels": self.labels,
            "titles": list(self.titles),
            "sources": list(self.sources),
        }


@dataclass
class LinkReport:
    """Everything ``scan`` found: the pairs plus what did not resolve."""

    pairs: list[Pair]
    directed: list[tuple[str, str, str]]  # (source note id, target note id, label)
    unresolved: list[dict]  # {"note", "source", "target", "resolved"}
    dropped: list[dict]  # resolved, but to a dead note, the same note, or another user's
    relative_links: int
    rules: Counter = field(default_factory=Counter)  # match rule -> resolved links (see RULES)
    users: list[str] = field(default_factory=list)  # users with live notes (reported even with no pair)

    def counts(self) -> dict:
        directed_pairs = {(s, t) for s, t, _ in self.directed}
        per_user: dict[str, dict] = {}
        for user in sorted(set(self.users) | {p.user_id for p in self.pairs}):
            ups = [p for p in self.pairs if p.user_id == user]
            per_user[user] = {
                "undirected_pairs": len(ups),
                "directed_links": sum(len(p.directions) for p in ups),
                "notes_involved": len({x for p in ups for x in (p.a, p.b)}),
            }
        return {
            "relative_links": self.relative_links,
            "directed_links": len(directed_pairs),
            "directed_link_occurrences": len(self.directed),
            "undirected_pairs": len(self.pairs),
            "mutual_pairs": sum(1 for p in self.pairs if len(p.directions) == 2),
            "notes_involved": len({x for p in self.pairs for x in (p.a, p.b)}),
            "per_user": per_user,
            "resolved_by_rule": {r: self.rules[r] for r in RULES},
            "unresolved_links": len(self.unresolved),
            "dropped_links": dict(Counter(d["reason"] for d in self.dropped)),
        }


def is_live(note: dict) -> bool:
    return not note.get("IsTrash") and not note.get("IsDeleted")


def split_source(source: str) -> tuple[str, str]:
    """``owner/repo:path`` -> (``owner/repo``, ``path``); no colon -> ("", source)."""
    repo, sep, path = (source or "").partition(":")
    return (repo, path) if sep else ("", source or "")


def _clean_label(text: str) -> str:
    return _WS.sub(" ", html.unescape(_TAG.sub("", text))).strip()


def _md_destination(text: str, start: int) -> str | None:
    """The link destination starting at ``text[start]`` (just after ``](``), or None."""
    i, n = start, len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "<":
        end = text.find(">", i + 1)
        if end < 0 or "\n" in text[i + 1 : end]:
            return None
        return text[i + 1 : end]
    depth, j = 0, i
    while j < n:
        c = text[j]
        if c == "\\" and j + 1 < n:
            j += 2
            continue
        if c.isspace():
            break
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        j += 1
    return text[i:j] if j > i else None


def markdown_links(text: str) -> list[Link]:
    """Inline links ``[label](target "title")`` outside code; images ``![..](..)`` skipped."""
    text = _FENCE.sub("", text)
    text = _INLINE_CODE.sub("", text)
    links: list[Link] = []
    i, n = 0, len(text)
    while True:
        i = text.find("[", i)
        if i < 0:
            break
        # find the matching "]" (labels may nest brackets, e.g. "[[1]](...)")
        depth, j = 0, i
        while j < n:
            c = text[j]
            if c == "\\":
                j += 2
                continue
            if c == "[":
                depth += 1
            elif c == "]":
                depth -= 1
                if depth == 0:
                    break
            elif c == "\n" and text.startswith("\n\n", j):
                break
            j += 1
        if j >= n or text[j] != "]":
            i += 1
            continue
        is_image = i > 0 and text[i - 1] == "!" and not (i > 1 and text[i - 2] == "\\")
        if text.startswith("(", j + 1):
            target = _md_destination(text, j + 2)
            if target is not None and not is_image:
                links.append(Link(target, _clean_label(text[i + 1 : j])))
            i = j + 2
        else:
            i += 1  # not a link: look inside the brackets too
    return links


def html_links(text: str) -> list[Link]:
    """``<a href="target">label</a>`` outside ``<pre>``/``<code>``; ``<img>`` is not a link."""
    text = _HTML_CODE.sub("", text)
    links = []
    for m in _HTML_A.finditer(text):
        h = _HREF.search(m.group(1))
        if not h:
            continue
        target = html.unescape(next(g for g in h.groups() if g is not None))
        links.append(Link(target, _clean_label(m.group(2))))
    return links


def note_links(note: dict) -> list[Link]:
    content = note.get("Content") or ""
    return markdown_links(content) if note.get("IsMarkdown", True) else html_links(content)


def relative_path(target: str) -> str | None:
    """The decoded path part of a relative link target, or None if the link is not relative."""
    t = target.strip()
    if not t or t.startswith("#") or t.startswith("//") or _SCHEME.match(t):
        return None
    t = t.split("#", 1)[0].split("?", 1)[0]
    if not t:
        return None
    return unquote(html.unescape(t))


def resolve_target(note_path: str, target_path: str) -> str:
    """``target_path`` resolved against the directory of ``note_path`` (both repository paths)."""
    if target_path.startswith("/"):
        joined = target_path.lstrip("/")
    else:
        joined = posixpath.join(posixpath.dirname(note_path), target_path)
    resolved = posixpath.normpath(joined)
    return "" if resolved == "." else resolved


RULES = ("exact", "+.md", "/README.md", "/index.md")


def candidates(path: str) -> list[tuple[str, str]]:
    """(rule, repository path) a resolved link may name, in the order of ``RULES``."""
    base = path.rstrip("/")
    out = [path, base + ".md", posixpath.join(base, "README.md"), posixpath.join(base, "index.md")]
    return [(rule, p) for rule, p in zip(RULES, out) if p]


def scan(notes: Iterable[dict]) -> LinkReport:
    """Find every relative link of every live note and resolve it (see the module docstring)."""
    notes = list(notes)
    by_source: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for note in notes:
        repo, path = split_source(note.get("Source", ""))
        if path:
            by_source[(repo, path)].append(note)

    directed: list[tuple[str, str, str]] = []
    unresolved: list[dict] = []
    dropped: list[dict] = []
    relative = 0
    rules: Counter = Counter()
    for note in notes:
        if not is_live(note):
            continue
        repo, path = split_source(note.get("Source", ""))
        for link in note_links(note):
            rel = relative_path(link.target)
            if rel is None:
                continue
            relative += 1
            resolved = resolve_target(path, rel)
            rule, found = next(((r, by_source[(repo, c)]) for r, c in candidates(resolved) if (repo, c) in by_source),
                               ("", None))
            info = {"note": note["NoteId"], "source": note.get("Source", ""), "target": link.target,
                    "resolved": f"{repo}:{resolved}" if repo else resolved, "label": link.label}
            if found is None:
                unresolved.append(info)
                continue
            rules[rule] += 1
            same_user = [t for t in found if t.get("UserId") == note.get("UserId")]
            live = [t for t in same_user if is_live(t)]
            if not same_user:
                dropped.append({**info, "reason": "other user"})
            elif not live:
                dropped.append({**info, "reason": "dead target"})
            elif all(t["NoteId"] == note["NoteId"] for t in live):
                dropped.append({**info, "reason": "self link"})
            else:
                for t in live:
                    if t["NoteId"] != note["NoteId"]:
                        directed.append((note["NoteId"], t["NoteId"], link.label))

    by_id = {n["NoteId"]: n for n in notes}
    pairs: dict[tuple[str, str], Pair] = {}
    for src, dst, label in directed:
        a, b = sorted((src, dst))
        pair = pairs.get((a, b))
        if pair is None:
            na, nb = by_id[a], by_id[b]
            pair = pairs[(a, b)] = Pair(a, b, na.get("UserId", ""), titles=(na.get("Title", ""), nb.get("Title", "")),
                                        sources=(na.get("Source", ""), nb.get("Source", "")))
        direction = "a->b" if src == a else "b->a"
        if direction not in pair.directions:
            pair.directions.append(direction)
            pair.directions.sort()
        labels = pair.labels.setdefault(direction, [])
        if label and label not in labels:
            labels.append(label)
    ordered = sorted(pairs.values(), key=lambda p: (p.user_id, p.sources, p.a, p.b))
    users = sorted({n.get("UserId", "") for n in notes if is_live(n)})
    return LinkReport(ordered, directed, unresolved, dropped, relative, rules, users)


def linked_pairs(notes: list[dict]) -> list[Pair]:
    """Undirected, deduplicated pairs of live notes of one user joined by a relative link."""
    return scan(notes).pairs


def neighbours(pairs: Iterable[Pair], exclude_links: bool = False) -> dict[str, set[str]]:
    """note id -> ids of the notes it is paired with (either direction).

    With ``exclude_links`` a note keeps only the partners it does not link to itself (those that link to it):
    the ones a system could not find just by reading the note's own links.
    """
    out: dict[str, set[str]] = defaultdict(set)
    for p in pairs:
        if not exclude_links or "a->b" not in p.directions:
            out[p.a].add(p.b)
        if not exclude_links or "b->a" not in p.directions:
            out[p.b].add(p.a)
    return dict(out)


def recall_at_k(pairs: Iterable[Pair], related: Callable[[str], list[str]], k: int = 5,
                exclude_links: bool = False) -> dict:
    """Recall@k of a "related notes" function against the link pairs.

    For every note ``n`` that takes part in at least one pair, let ``L(n)`` be the notes it is paired with
    (undirected: ``n`` links to them or they link to ``n``) and ``R(n) = related(n)[:k]`` (``n`` itself is
    dropped from the list before cutting to ``k``; duplicates count once). Then

    - ``macro`` = mean over notes of ``|L(n) ∩ R(n)| / |L(n)|`` (every note weighs the same);
    - ``micro`` = ``Σ |L(n) ∩ R(n)| / Σ |L(n)|`` over the same notes. Every undirected pair is counted once
      from each end, so this is the share of (note, linked note) ends found.

    ``exclude_links=True`` removes from ``L(n)`` the notes that ``n`` itself links to, keeping only the ones
    that link to ``n`` (a mutual pair then drops out at both ends; notes left with an empty ``L(n)`` are not
    counted). Use it when ``related`` may read the note's own links, so that merely echoing them scores nothing.

    Returns ``{"k", "exclude_links", "notes", "pairs", "links", "hits", "macro", "micro", "per_note"}``:
    ``notes`` = notes evaluated, ``pairs`` = undirected pairs given, ``links`` = ``Σ |L(n)|``, ``hits`` =
    ``Σ |L(n) ∩ R(n)|``, ``per_note`` = note id -> its recall. No notes gives 0.0 for both averages.
    """
    pairs = list(pairs)
    links = neighbours(pairs, exclude_links=exclude_links)
    per_note: dict[str, float] = {}
    hits = total = 0
    for note_id in sorted(links):
        wanted = links[note_id]
        got: list[str] = []
        for x in related(note_id):
            if x != note_id and x not in got:
                got.append(x)
            if len(got) == k:
                break
        found = len(wanted.intersection(got))
        per_note[note_id] = found / len(wanted)
        hits += found
        total += len(wanted)
    return {
        "k": k,
        "exclude_links": exclude_links,
        "notes": len(per_note),
        "pairs": len(pairs),
        "links": total,
        "hits": hits,
        "macro": sum(per_note.values()) / len(per_note) if per_note else 0.0,
        "micro": hits / total if total else 0.0,
        "per_note": per_note,
    }


def load_notes(folder: Path | None = None) -> list[dict]:
    """The notes of ``folder``'s ``corpus/notes.jsonl`` (by default the shared folder's)."""
    with open((folder or shared()) / "corpus" / "notes.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shared", nargs="?", type=Path, help="the shared folder (default: ../shared)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run on the sample notes (they hold no link)")
    args = ap.parse_args(argv)
    if args.tiny and args.shared:
        ap.error("--tiny reads the sample notes: no shared folder with it")
    if args.tiny:
        tiny_world()
    folder = args.shared or shared()
    notes = load_notes(folder)
    report = scan(notes)
    counts = report.counts()
    data = {
        "corpus": str(folder / "corpus" / "notes.jsonl"),
        "rules": __doc__.split("Resolution rules", 1)[1].split("Run ``python", 1)[0].strip(),
        "counts": counts,
        "pairs": [p.to_dict() for p in report.pairs],
        "unresolved": report.unresolved,
        "dropped": report.dropped,
    }
    out = results_file("related_links.json", args.tiny)
    out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(counts, ensure_ascii=False, indent=1))
    for u in report.unresolved[:10]:
        print(f"unresolved: {u['source']} -> {u['target']}  ({u['resolved']})")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
