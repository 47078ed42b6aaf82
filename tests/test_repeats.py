"""An answer that goes round in circles (rag.answer.repeats, rag.answer.support's "repeat"): the
real 1.5B wrote one four-line block 8 times over 87 s, every sentence standing on the note, and
all of it was shown. Each sentence is shown once, the stream is stopped (the request closed, so
the server stops writing) and the answer ends as any answer does, with its citations."""

from __future__ import annotations

import asyncio
import time

import pytest

from rag.answer import repeats
from rag.answer.service import AnswerService
from rag.answer.support import Checker, Gate, check, said
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat

from conftest import index_samples
from fakes.ollama import FakeOllama

QUESTION = "番茄炒蛋怎么做？"
NOTE = {1: ("[1] 番茄炒蛋 (菜谱 › 做法)",
            "番茄顶上划个十字，开水烫 30 秒后去皮，切小块。一定要先把鸡蛋炒好盛出。"
            "锅里留底油，葱白爆香，下番茄中火炒出汁。这时候加一小勺糖（大概 5 克），能压住番茄的酸味。"
            "倒回鸡蛋，翻炒十几秒，撒葱花出锅。")}
# the block the model wrote again and again: four lines, each standing on the note
BLOCK = ("1. 番茄顶上划个十字，开水烫 30 秒后去皮[1]。\n"
         "2. 一定要先把鸡蛋炒好盛出[1]。\n"
         "3. 锅里留底油，葱白爆香，下番茄中火炒出汁[1]。\n"
         "4. 加一小勺糖，能压住番茄的酸味[1]。\n")
LINES = [line.split(". ", 1)[1].removesuffix("[1]。") for line in BLOCK.splitlines()]


def pieces(text: str, size: int = 6) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def test_a_sentence_said_again_is_shown_once_and_counted_once():
    reply = BLOCK + "\n" + BLOCK.replace("1. ", "5. ").replace("[1]", "") + "\n" + BLOCK + "倒回鸡蛋，翻炒十几秒出锅[1]。"
    gate = Gate(Checker(QUESTION, NOTE))
    out = "".join(gate.feed(p) for p in pieces(reply)) + gate.flush()
    assert out == check(reply, QUESTION, NOTE).text  # streamed or whole, the same
    for line in LINES:
        assert out.count(line) == 1, out
    assert "倒回鸡蛋，翻炒十几秒出锅[1]" in out  # something new after the repeats is shown
    result = gate.result
    assert len(result.repeated) == 8 and len(result.supported) == 5 and result.share == 1.0
    assert "8 said again (shown once)" in result.summary()
    # markers, list numbers, Markdown and punctuation aside, it is the same sentence
    assert said("2. **一定要先把鸡蛋炒好盛出**[1]。") == said("- 一定要先把鸡蛋炒好盛出。") != ""
    assert said("是。") == ""  # too little to know again


def test_a_reply_going_round_is_known_after_a_few_sentences_said_again():
    gate = Gate(Checker(QUESTION, NOTE))
    gate.feed(BLOCK)
    assert not repeats.looping(gate.verdicts)
    gate.feed("\n" + BLOCK.split("3. ")[0])  # two lines again: a summary may say a line or two again
    assert not repeats.looping(gate.verdicts)
    gate.feed("3. 锅里留底油，葱白爆香，下番茄中火炒出汁[1]。\n4. 加一")
    assert repeats.looping(gate.verdicts) == repeats.RUN
    assert gate.cut() == ""  # the line being written when it was stopped is left out
    assert gate.result.text.count("加一") == 1


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("repeats"), use_embedder)


def test_a_looping_model_is_stopped_and_the_answer_ends_with_each_sentence_once(indexed, use_embedder):
    with FakeOllama() as ollama:
        cfg = indexed.ollama.model_copy(update={"host": ollama.url, "timeout": 120.0})
        settings = indexed.model_copy(update={"ollama": cfg})
        index = NoteIndex.open(settings, embedder=use_embedder)
        service = AnswerService(settings, index, chat=OllamaChat(cfg))
        try:
            ollama.reply(*pieces(BLOCK), delay=0.005, loop=True)  # again and again, until the client hangs up
            streamed: list[str] = []
            started = time.monotonic()
            answer = asyncio.run(service.ask(QUESTION, "local", on_token=streamed.append))
            assert ollama.hung_up.wait(30), "the request was never closed: the server would go on writing"
            assert time.monotonic() - started < 30
            shown = "".join(streamed)
            assert shown.strip() == answer.answer
            for line in LINES:
                assert shown.count(line) == 1, shown
            assert answer.trace.outcome == "llm" and [c.title for c in answer.citations] == ["番茄炒蛋"]
            assert answer.answer.rstrip().endswith("[1]。") and answer.notice is None
            assert "the LLM was stopped" in answer.trace.decision and "said again" in answer.trace.support
            chat = ollama.chats()[-1]
            assert chat["options"]["repeat_penalty"] == cfg.repeat_penalty
            assert chat["options"]["repeat_last_n"] == cfg.repeat_last_n and "num_predict" in chat["options"]
        finally:
            service.close()
            index.close()
