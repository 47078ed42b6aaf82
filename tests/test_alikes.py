"""A voice question's sound-alikes (rag.answer.alikes): Whisper base writes Chinese words as other
characters of the same sound (快照 → 快赵); the words of the candidates found that a heard run
sounds exactly like join the search, for heard questions only, and show in the trace (/why)."""

from __future__ import annotations

import asyncio

import pytest

from rag.answer.alikes import sound_alikes
from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat

from conftest import index_samples
from fakes.ollama import FakeOllama

pytest.importorskip("pypinyin")

RESTIC = "用 restic 备份家里的服务器"


def test_a_heard_run_that_sounds_like_a_word_of_the_passages_means_that_word():
    passages = ["每天凌晨用 restic 备份，保留最近 7 个每日快照。", "快照可以挂载出来浏览。"]
    assert sound_alikes("家里服务器的快赵保留几天的？", passages) == ["快照"]
    assert sound_alikes("被份要保留几天", passages) == ["备份"]
    # words the passages hold are meant as said; nothing alike, nothing added; no Chinese, nothing
    assert sound_alikes("家里服务器的快照保留几天的？", passages) == []
    assert sound_alikes("明天下雨吗", passages) == []
    assert sound_alikes("How many snapshots are kept?", passages) == []
    # each word once, at most ``most``
    assert sound_alikes("快赵和快赵", passages) == ["快照"]
    assert len(sound_alikes("被份快赵", passages, most=1)) == 1


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("alikes"), use_embedder, rerank={"kind": "none"})


def test_only_a_heard_question_is_searched_with_its_sound_alikes_and_the_trace_says_so(sample_index, use_embedder):
    s = sample_index
    with FakeOllama() as ollama:
        s = s.model_copy(update={"ollama": s.ollama.model_copy(update={"host": ollama.url})})
        index = NoteIndex.open(s, embedder=use_embedder)
        svc = AnswerService(s, index, chat=OllamaChat(s.ollama))
        try:
            ollama.reply("保留最近 7 个每日快照[1]。")
            heard = asyncio.run(svc.ask("家里服务器的快赵保留几天的？", "local", heard=True))
            assert heard.trace.alikes == ["快照"]
            assert ("sounds like", "快照") in heard.trace.rows()
            assert heard.trace.candidates[0].title == RESTIC
            ollama.reply("保留最近 7 个每日快照[1]。")
            typed = asyncio.run(svc.ask("家里服务器的快赵保留几天的？", "local"))
            assert typed.trace.alikes == [] and all(what != "sounds like" for what, _ in typed.trace.rows())
        finally:
            svc.close()
