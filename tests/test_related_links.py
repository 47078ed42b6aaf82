"""bench/related_links.py: cross-link pairs of the corpus and recall@k over them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "related_links.py"
_spec = importlib.util.spec_from_file_location("bench_related_links", _PATH)
rl = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rl  # dataclasses look the module up by name
_spec.loader.exec_module(rl)

U1 = "u1"
U2 = "u2"


def note(nid, path, content="", *, user=U1, md=True, trash=False, deleted=False, repo="o/r"):
    return {"NoteId": nid, "UserId": user, "Title": nid, "Content": content, "IsMarkdown": md,
            "IsTrash": trash, "IsDeleted": deleted, "Source": f"{repo}:{path}"}


def pair_ids(pairs):
    return {(p.a, p.b) for p in pairs}


def test_relative_links_with_parent_dirs_fragments_and_queries():
    notes = [
        note("a", "docs/java/a.md", "see [B](../db/b.md#section) and [C](./c.md?x=1) and [D](d)"),
        note("b", "docs/db/b.md"),
        note("c", "docs/java/c.md"),
        note("d", "docs/java/d.md"),
    ]
    pairs = rl.linked_pairs(notes)
    assert pair_ids(pairs) == {("a", "b"), ("a", "c"), ("a", "d")}
    ab = next(p for p in pairs if p.b == "b")
    assert ab.directions == ["a->b"] and ab.labels == {"a->b": ["B"]}


def test_url_encoded_chinese_names_in_markdown_and_html():
    target = "%E7%BA%A2%E7%83%A7%E8%82%89.md"  # 红烧肉.md
    notes = [
        note("a", "dishes/meat/红烧肉.md", "[腌](../../tips/学习腌.md)"),
        note("b", "tips/学习腌.md", f'<p>见 <a href="../dishes/meat/{target}">红烧<b>肉</b></a></p>', md=False),
        note("c", "dishes/meat/x.md", f"[rsr](<./{target}> \"title\")"),
    ]
    report = rl.scan(notes)
    assert pair_ids(report.pairs) == {("a", "b"), ("a", "c")}
    ab = next(p for p in report.pairs if p.b == "b")
    assert ab.directions == ["a->b", "b->a"]
    assert ab.labels == {"a->b": ["腌"], "b->a": ["红烧肉"]}
    assert report.counts()["mutual_pairs"] == 1


def test_html_anchor_variants_and_directory_links():
    notes = [
        note("a", "docs/a.md", "<a class='x' href='./b.md'>B</a> <a href=sub/>S</a> "
             "<a href=\"c\">C</a> <img src=\"./b.md\"><pre><code><a href=\"./d.md\">D</a></code></pre>", md=False),
        note("b", "docs/b.md"),
        note("c", "docs/c/index.md"),
        note("d", "docs/d.md"),
        note("s", "docs/sub/README.md"),
    ]
    report = rl.scan(notes)
    assert pair_ids(report.pairs) == {("a", "b"), ("a", "c"), ("a", "s")}
    assert report.counts()["resolved_by_rule"] == {"exact": 1, "+.md": 0, "/README.md": 1, "/index.md": 1}


def test_absolute_links_anchors_images_and_code_are_ignored():
    content = "\n".join([
        "[web](https://example.com/b.md) [proto](//host/b.md) [mail](mailto:x@y.z)",
        "[top](#b) ![img](./b.md) [![badge](x.png)](https://ci)",
        "`[code](./b.md)`",
        "```",
        "[fenced](./b.md)",
        "```",
        "[dead](./missing.md) [real](./c.md)",
    ])
    notes = [note("a", "d/a.md", content), note("b", "d/b.md"), note("c", "d/c.md")]
    report = rl.scan(notes)
    assert pair_ids(report.pairs) == {("a", "c")}
    assert report.relative_links == 2
    assert [u["target"] for u in report.unresolved] == ["./missing.md"]
    assert report.unresolved[0]["resolved"] == "o/r:d/missing.md"


def test_trashed_deleted_cross_user_self_and_other_repo_links_ignored():
    notes = [
        note("a", "d/a.md", "[t](t.md) [x](x.md) [u](u.md) [self](a.md) [b](b.md)"),
        note("t", "d/t.md", "[a](a.md)", trash=True),  # trashed: neither target nor source
        note("x", "d/x.md", deleted=True),
        note("u", "d/u.md", "[a](a.md)", user=U2),  # same repo path, other user
        note("b", "d/b.md", repo="other/repo"),  # same path in another repository
    ]
    report = rl.scan(notes)
    assert report.pairs == []
    reasons = sorted(d["reason"] for d in report.dropped)
    assert reasons == ["dead target", "dead target", "other user", "other user", "self link"]
    assert [u["target"] for u in report.unresolved] == ["b.md"]
    counts = report.counts()
    assert counts["per_user"][U2] == {"undirected_pairs": 0, "directed_links": 0, "notes_involved": 0}


def test_duplicate_links_make_one_pair_and_counts():
    notes = [
        note("a", "d/a.md", "[B1](b.md) [B2](./b.md) [B1](b.md#x) [C](c.md)"),
        note("b", "d/b.md", "[A](a.md)"),
        note("c", "d/c.md"),
        note("z", "d/z.md", "[A](a.md)", user=U1),
    ]
    report = rl.scan(notes)
    counts = report.counts()
    assert counts["undirected_pairs"] == 3
    assert counts["directed_links"] == 4  # a->b, b->a, a->c, z->a
    assert counts["directed_link_occurrences"] == 6
    assert counts["notes_involved"] == 4
    ab = next(p for p in report.pairs if (p.a, p.b) == ("a", "b"))
    assert ab.labels == {"a->b": ["B1", "B2"], "b->a": ["A"]}


def test_recall_at_k():
    pairs = [
        rl.Pair("a", "b", U1, directions=["a->b"]),
        rl.Pair("a", "c", U1, directions=["a->b", "b->a"]),
        rl.Pair("b", "d", U1, directions=["b->a"]),  # d links to b
    ]
    ranked = {"a": ["a", "b", "x", "c"], "b": ["b", "x"], "c": ["a"], "d": ["b", "b"]}
    res = rl.recall_at_k(pairs, lambda n: ranked.get(n, []), k=2)
    # a: {b,c} finds b (self dropped, cut at 2: b, x) -> 1/2; b: {a,d} -> 0; c: {a} -> 1; d: {b} -> 1
    assert res["per_note"] == {"a": 0.5, "b": 0.0, "c": 1.0, "d": 1.0}
    assert res["macro"] == pytest.approx(2.5 / 4)
    assert res["micro"] == pytest.approx(3 / 6)
    assert (res["notes"], res["pairs"], res["links"], res["hits"]) == (4, 3, 6, 3)
    assert rl.recall_at_k(pairs, lambda n: ranked.get(n, []), k=3)["per_note"]["a"] == 1.0

    # only partners that link to the note: a keeps nothing (it links to b and c, c also links back),
    # b keeps a and d, c keeps nothing, d keeps nothing (it links to b)
    ex = rl.recall_at_k(pairs, lambda n: ranked.get(n, []), k=2, exclude_links=True)
    assert ex["per_note"] == {"b": 0.0}
    assert ex["links"] == 2 and ex["exclude_links"] is True
    empty = rl.recall_at_k([], lambda n: [], k=5)
    assert (empty["macro"], empty["micro"], empty["notes"]) == (0.0, 0.0, 0)


def test_shared_corpus_pairs(shared):
    notes = rl.load_notes(shared)
    report = rl.scan(notes)
    counts = report.counts()
    # The issue says "about 136"; notes.jsonl gives 137 (132 JavaGuide + 5 HowToCook, all user one),
    # stable across parser variants (with/without code stripping, a plain regex parser).
    assert counts["undirected_pairs"] == 137
    assert counts["directed_links"] == 152 and counts["mutual_pairs"] == 15
    assert counts["notes_involved"] == 126
    assert 20 <= counts["unresolved_links"] <= 30
    by_id = {n["NoteId"]: n for n in notes}
    for p in report.pairs:
        na, nb = by_id[p.a], by_id[p.b]
        assert p.a < p.b and na["UserId"] == nb["UserId"] == p.user_id
        assert rl.is_live(na) and rl.is_live(nb)
        assert rl.split_source(na["Source"])[0] == rl.split_source(nb["Source"])[0]
