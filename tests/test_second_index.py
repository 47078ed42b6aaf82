"""The second dense index (``rag.index.second``): filled beside the first index from its chunks,
resumed after a stop, only changed chunks embedded again, and fused into the search for the
notes it covers while the others rank as the first index ranks them. The first index is the
sample notes with USE; the second embedder the tiny EmbeddingGemma stand-in (``gemma_world``)."""

from __future__ import annotations

import pytest

from rag.answer.types import Trace
from rag.config import EmbedderConfig
from rag.index import embed
from rag.index.note_index import NoteIndex
from rag.index.points import point_id
from rag.index.retrieve import search
from rag.index.second import SecondIndex
from sync.indexer import Indexer
from sync.sources import open_source
from sync.state import State

from conftest import make_settings
from gemma_world import tiny_gemma

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torch")]
USER = "local"
QUESTION = "付款失败后第一次重试要等多久"


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("sentence_transformers", reason="needs the [gemma] extra")
    return tiny_gemma(tmp_path_factory.mktemp("gemma") / "embeddinggemma-300m")


@pytest.fixture(scope="module")
def gemma_embedder(gemma_folder):
    return embed.load(EmbedderConfig(kind="gemma", model=str(gemma_folder), threads=1), cache=False)


def synced(settings, use_embedder):
    """One index pass of the settings' notes folder into the first index."""
    state = State(settings.state_dir)
    try:
        with NoteIndex.open(settings, create=True, embedder=use_embedder) as index:
            source = open_source(settings)
            Indexer(index, state, source.name).run(source.notes())
    finally:
        state.close()


@pytest.fixture
def world(tmp_path, notes_dir, use_embedder):
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes_dir)})
    synced(settings, use_embedder)
    return settings


def test_it_fills_from_the_first_index_and_resumes_after_a_stop(world, use_embedder, gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        chunks = sum(first.store.count_by_user().values())
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            plan = second.plan(first.store)
            assert plan.chunks == chunks and len(plan.todo) == chunks and plan.current == 0
            assert second.fill(4) == 4
            assert second.fill(8, stop=lambda: True) == 1  # a question came: the batch ends after its chunk
            assert second.progress()["current"] == 5 and second.progress()["left"] == chunks - 5
        finally:
            second.close()  # stopped here: what was written stays
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            plan = second.plan(first.store)
            assert plan.current == 5 and len(plan.todo) == chunks - 5
            while second.fill(7):
                pass
            assert second.progress()["left"] == 0 and second.progress()["seconds_left"] == 0
            assert second.covered(USER) == first.store.note_ids(USER)
            assert second.plan(first.store).todo == []  # nothing left to embed
        finally:
            second.close()


def test_only_changed_chunks_are_embedded_again_and_removed_notes_leave(world, notes_dir, use_embedder,
                                                                        gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            second.plan(first.store)
            while second.fill(16):
                pass
        finally:
            second.close()
    recipe = notes_dir / "生活" / "菜谱" / "番茄炒蛋.md"
    recipe.write_text(recipe.read_text(encoding="utf-8") + "\n\n## 小贴士\n\n出锅前撒一把葱花，颜色更好看。\n",
                      encoding="utf-8")
    (notes_dir / "生活" / "周末徒步香山.md").unlink()
    synced(world, use_embedder)
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            plan = second.plan(first.store)
            changed = {t.note_id for t in plan.todo}
            assert len(changed) == 1 and 1 <= len(plan.todo) <= 2  # the recipe's new or grown last chunk
            assert plan.current == plan.chunks - len(plan.todo)
            assert second.store.note_ids(USER) == first.store.note_ids(USER)  # the hike's points went
        finally:
            second.close()


def test_the_search_is_the_first_indexs_until_notes_are_covered(world, use_embedder, gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        before = search(first, QUESTION, USER, 6)
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            first.second = second
            second.plan(first.store)  # nothing covered yet: the ranking is the first embedder's
            assert [(h.point_id, round(h.score, 6)) for h in search(first, QUESTION, USER, 6)] == \
                   [(h.point_id, round(h.score, 6)) for h in before]
            while second.fill(16):
                pass
            dense = first.store.search(first.embed_query([QUESTION])[0], None, USER, 50)[0]
            ranking, _ = second.ranking(first.store, QUESTION, USER, dense, 50)
            mine = second.store.search(gemma_embedder.embed_query([QUESTION])[0], None, USER, 50)[0]
            assert [c.id for c in ranking] == [c.id for c in mine]  # all covered: the second model's alone
            assert search(first, QUESTION, USER, 6)  # and the search answers with it
        finally:
            first.second = None
            second.close()


def test_the_trace_names_which_embedder_ranked_the_notes(world, use_embedder, gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        assert first.dense_side(USER) == ""  # no second index: nothing to tell apart
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            first.second = second
            second.plan(first.store)
            total = len(first.store.note_ids(USER))
            assert "covers none of your notes yet" in first.dense_side(USER)
            while not second.covered(USER):  # a note is covered once each of its chunks is
                second.fill(1)
            n = len(second.covered(USER))
            said = first.dense_side(USER)
            assert f"{gemma_embedder.model_id} for {n} of {total} notes, {use_embedder.model_id} for the rest" in said
            while second.fill(16):
                pass
            said = first.dense_side(USER)
            assert said == f"{gemma_embedder.model_id} for {total} of {total} notes; dense weight " \
                           f"{world.second_index.dense_weight:.2f}"
            trace = Trace(QUESTION, QUESTION, dense=said)
            assert ("dense", said) in trace.rows()
        finally:
            first.second = None
            second.close()


def test_chunks_found_in_the_vector_cache_do_not_count_in_the_fill_rate(world, use_embedder, gemma_folder, tmp_path):
    """The rate says how fast this machine's model embeds (status's time left, auto's night): a
    chunk the vector cache already held (a rebuilt index, a shared cache) took no model time."""
    cached = embed.load(EmbedderConfig(kind="gemma", model=str(gemma_folder), threads=1,
                                       cache=tmp_path / "vectors.db"))
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=cached)
        try:
            plan = second.plan(first.store)
            cached.embed([t.text for t in plan.todo])  # every chunk's vector in the cache before the fill
            while second.fill(16):
                pass
            assert second.progress()["left"] == 0 and second.filled == plan.chunks
            assert second.rate is None and second.progress()["seconds_left"] is None  # no model time: no rate
        finally:
            second.close()


def note_titled(store, fragment: str) -> str:
    """The id of the sample note whose title holds ``fragment``."""
    for note in store.note_ids(USER):
        first = store.payloads([point_id(note, 0)]).get(point_id(note, 0)) or {}
        if fragment in first.get("title", ""):
            return note
    raise AssertionError(f"no note titled with {fragment}")


def test_a_note_changed_since_the_fill_ranks_as_the_first_index_ranks_it(world, notes_dir, use_embedder,
                                                                         gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            second.plan(first.store)
            while second.fill(16):
                pass
            held = second.plan_made  # the plan as the worker holds it until its next look
        finally:
            second.close()
    note = notes_dir / "编程" / "Python" / "支付接口重试.md"
    note.write_text(note.read_text(encoding="utf-8").replace("重试", "再试一次"), encoding="utf-8")
    synced(world, use_embedder)
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            second.plan_made = held
            changed = note_titled(first.store, "支付")
            assert changed in second.covered(USER)
            dense = first.store.search(first.embed_query([QUESTION])[0], None, USER, 50)[0]
            ranking, _ = second.ranking(first.store, QUESTION, USER, dense, 50)
            from_first = [c.id for c in dense if c.note_id == changed]
            assert from_first and [c.id for c in ranking if c.note_id == changed] == from_first
            assert second.plan(first.store).todo  # and the next look embeds it again
        finally:
            second.close()


def test_another_output_size_empties_it_to_be_filled_again(world, use_embedder, gemma_folder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        for dims in (768, 256):  # 8 chunks written at 768: none of them counts at 256
            e = embed.load(EmbedderConfig(kind="gemma", model=str(gemma_folder), threads=1, dimensions=dims),
                           cache=False)
            second = SecondIndex.open(world, embedder=e)
            try:
                plan = second.plan(first.store)
                assert plan.current == 0 and len(plan.todo) == plan.chunks
                second.fill(8)
            finally:
                second.close()


def test_the_dense_weight_moves_with_the_share_it_covers(world, use_embedder, gemma_embedder):
    with NoteIndex.open(world, embedder=use_embedder) as first:
        second = SecondIndex.open(world, embedder=gemma_embedder)
        try:
            second.plan(first.store)
            assert second.dense_weight(USER, 0.35) == 0.35  # nothing covered: the first index's
            notes = sorted(first.store.note_ids(USER))
            second.plan_made.covered[USER] = set(notes[: len(notes) // 2])
            assert 0.35 < second.dense_weight(USER, 0.35) < 0.5
            while second.fill(16):
                pass
            assert second.dense_weight(USER, 0.35) == pytest.approx(0.5)  # second_index.dense_weight
        finally:
            second.close()


def test_a_second_index_of_the_first_embedder_is_refused(tmp_path):
    from rag.errors import UserError

    settings = make_settings(tmp_path, embedder={"kind": "gemma"}, second_index={"enabled": "on"})
    with pytest.raises(UserError, match="second_index.embedder is the index's own"):
        SecondIndex.open(settings)


def test_auto_is_quiet_where_its_model_was_never_fetched(tmp_path):
    from bot.usecases.status import second_index
    from sync.second_jobs import wanted

    settings = make_settings(tmp_path)
    assert settings.second_index.enabled == "auto" and not wanted(settings)
    assert second_index(settings) is None  # status says nothing of it
    folder = tmp_path / "data" / "models" / "embeddinggemma-300m"
    folder.mkdir(parents=True)
    (folder / "modules.json").write_text("[]")
    assert wanted(settings) and second_index(settings)["enabled"] == "auto"
