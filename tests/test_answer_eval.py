"""The answer eval: its metrics on handmade answers, the reader stand-in LLM, and
`leanote-rag eval --answers` end to end on the sample notes with the stand-in (a real
HTTP server speaking Ollama's API) and real embedded Qdrant."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from rag.answer.types import Answer, Candidate, Citation, Trace
from bot.cli import main
from rag.answer.evidence import Evidence, messages
from rag.answer.expand import SCHEMA, parse
from rag.answer.expand import SYSTEM as EXPAND_SYSTEM
from rag.config import OllamaConfig
from rag.eval import answer_report, percentile
from rag.llm import OllamaChat
from rag.speed import Usage
from sync.sources.files import stable_id

from conftest import EXAMPLES
from fakes.ollama import FakeOllama, fake_tokens

REFUSAL = "我笔记里没有相关内容"


# --- the metrics, on handmade answers -------------------------------------------------------


def cite(*note_ids: str) -> list[Citation]:
    return [Citation(n, nid, "t", "nb", "", "u", "x", 1.0) for n, nid in enumerate(note_ids, start=1)]


def answer(outcome: str, text: str = "答[1]", cited=(), closest=(), timings=None, usage=None, evidence=(),
           citing: str = "") -> Answer:
    trace = Trace("q", "q", outcome=outcome, decision=f"why {outcome}", citing=citing)
    trace.candidates = [Candidate(f"p{i}", nid, "t", "", 1, 0.5, 1, 1.0, 0.9, evidence=i + 1)
                        for i, nid in enumerate(evidence)]
    return Answer("q", text, used_llm=outcome in ("llm", "llm_passages"), grounded=bool(cited),
                  citations=cite(*cited), closest=cite(*closest), timings_ms=timings or {"total": 10.0},
                  usage=usage or {}, trace=trace)


def question(qid: str, kind: str, gold=(), traps=()) -> dict:
    return {"id": qid, "question": "q", "user_id": "u", "type": kind, "gold_note_ids": list(gold),
            "trap_note_ids": list(traps)}


def llm_timings(first: float, total: float) -> dict:
    return {"retrieve": 5.0, "sources": 6.0, "first_token": first, "total": total}


def ollama_usage(tokens: int, estimated: int = 999) -> dict:
    return {"prompt_tokens": tokens, "prompt_seconds": 1.0, "output_tokens": 9, "output_seconds": 1.0,
            "prompt_tokens_estimated": estimated}


HANDMADE = [
    # answerable
    (question("a1", "fact", gold=["g1"]),  # the LLM cites with markers
     answer("llm", cited=["g1", "x"], timings=llm_timings(100, 1000), usage=ollama_usage(1000), evidence=["g1", "x"],
            citing="cited")),
    (question("a2", "fact", gold=["g2"]),  # cited by inference, another note only
     answer("llm", cited=["x"], timings=llm_timings(200, 2000), usage=ollama_usage(2000), evidence=["x", "g2"],
            citing="inferred")),
    (question("a3", "paraphrase", gold=["g3"]),  # refused before the LLM
     answer("refused", text=REFUSAL, closest=["x"])),
    (question("a4", "paraphrase", gold=["g4"]),  # refused by the LLM: the passages instead, the gold note among them
     answer("llm_passages", text="[1] t\n段落", cited=["g4"], timings=llm_timings(300, 3000), usage=ollama_usage(3000),
            citing="refused")),
    (question("a5", "paraphrase", gold=["g5"]),  # the LLM answered from nothing in the evidence: passages instead
     answer("llm_passages", text="[1] t\n段落", cited=["x"], timings=llm_timings(400, 4000), usage=ollama_usage(4000),
            citing="uncited")),
    (question("a6", "multi_note", gold=["g6", "g7"]),  # the LLM failed: passages, citing both gold notes
     answer("fallback", cited=["g6", "g7"], timings={"retrieve": 5.0, "first_token": 50.0, "total": 500.0})),
    (question("a7", "keyword", gold=["g8"], traps=["trap1"]),  # no LLM configured; cites a trap note
     answer("extractive", cited=["trap1", "g8"], timings={"retrieve": 5.0, "total": 20.0}, evidence=["trap1"])),
    # no_answer
    (question("n1", "no_answer", traps=["trap2"]), answer("refused", text=REFUSAL, closest=["trap2"])),
    (question("n2", "no_answer"),
     answer("llm_passages", text="[1] t\n段落", cited=["x"], timings=llm_timings(500, 5000),
            usage=ollama_usage(0, estimated=5000), citing="refused")),
    (question("n3", "no_answer"),
     answer("llm", cited=["x"], timings=llm_timings(600, 6000), usage=ollama_usage(6000), citing="cited")),
    (question("n4", "no_answer"),  # an answer recorded as the LLM's citing nothing (never shown so since 17)
     answer("llm", text="不知道。", timings=llm_timings(700, 7000), usage=ollama_usage(7000), citing="uncited")),
]


def test_answerable_questions_count_the_llms_refusals_uncited_and_cited_answers_apart():
    r = answer_report(HANDMADE, REFUSAL)
    assert r["questions"] == 11
    assert r["answerable"] == {
        "n": 7, "gold_cited": 4, "gold_cited_rate": round(4 / 7, 3), "gold_cited_by_llm": 1,
        "gold_cited_by_llm_rate": round(1 / 7, 3), "all_gold_cited": 4, "gold_in_evidence": 2,
        "llm_cited": 1, "llm_inferred": 1, "refused_before_llm": 1, "refused_by_llm": 1, "uncited_by_llm": 1,
        "passages_instead": 2, "refusal_after_llm": 0, "false_refusals": 2, "false_refusal_rate": round(2 / 7, 3),
        "shown_uncited": 0, "cited_other_notes_only": 1,
    }
    rows = {row["id"]: row for row in r["rows"]}
    assert [rows[q]["verdict"] for q in ("a1", "a2", "a3", "a4", "a5", "a6", "a7")] == [
        "llm_cited", "llm_inferred", "refused", "llm_refused", "llm_uncited", "fallback", "extractive"]
    assert rows["a1"]["cited"] == ["g1", "x"] and rows["a1"]["gold_cited"] is True
    assert rows["a4"]["gold_cited"] is True and rows["a4"]["gold_cited_by_llm"] is False  # the passages', not the LLM's
    assert rows["a2"]["gold_cited"] is False and rows["a2"]["gold_in_evidence"] is True
    assert rows["a6"]["all_gold_cited"] is True and rows["n1"]["gold_cited"] is None


def test_no_answer_questions_traps_outcomes_and_fallbacks():
    r = answer_report(HANDMADE, REFUSAL)
    assert r["no_answer"] == {"n": 4, "refused_before_llm": 1, "refused_by_llm": 1, "uncited_by_llm": 0,
                              "passages_instead": 1, "refusal_after_llm": 0, "refused": 2, "not_answered": 2,
                              "answered_anyway": 2, "shown_uncited": 1}
    assert r["traps"] == {"questions_with_traps": 2, "cited": 1, "shown_as_closest": 1}
    rows = {row["id"]: row for row in r["rows"]}
    assert rows["a7"]["trap_cited"] == ["trap1"] and rows["n1"]["trap_closest"] == ["trap2"]
    assert rows["n4"]["verdict"] == "cited_nothing"
    assert r["outcomes"] == {"llm": 4, "llm_passages": 3, "refused": 2, "fallback": 1, "extractive": 1}
    assert r["fallbacks"] == 1


def test_latency_counts_the_first_token_only_where_the_llm_answered_and_says_where_tokens_came_from():
    r = answer_report(HANDMADE, REFUSAL, skipped=3, llm={"model": "m"})
    first = [100, 200, 300, 400, 500, 600, 700]  # not the fallback's 50: the LLM did not answer that one
    assert r["latency_ms"]["first_token"] == {"n": 7, "p50": 400.0, "p95": percentile(first, 95)}
    assert r["latency_ms"]["total"]["n"] == 11
    # Ollama's count where it reported one, else the estimate (n2: 5000); no LLM prompt, no row
    assert r["prompt_tokens"] == {"n": 7, "p50": 4000.0, "p95": percentile([1000, 2000, 3000, 4000, 5000, 6000, 7000], 95),
                                  "source": "mixed: 6 from ollama, 1 estimated"}
    rows = {row["id"]: row for row in r["rows"]}
    assert rows["n2"]["prompt_tokens_source"] == "estimated" and rows["a3"]["prompt_tokens"] is None
    assert rows["a6"]["first_token_ms"] is None and rows["a1"]["first_token_ms"] == 100
    assert r["skipped_after_changes"] == 3 and r["llm"] == {"model": "m"}


def test_per_type():
    by_type = answer_report(HANDMADE, REFUSAL)["by_type"]
    assert by_type["fact"] == {"n": 2, "gold_cited": 1, "gold_cited_by_llm": 1, "gold_cited_rate": 0.5,
                               "false_refusals": 0, "uncited_by_llm": 0, "passages_instead": 0}
    assert by_type["paraphrase"] == {"n": 3, "gold_cited": 1, "gold_cited_by_llm": 0, "gold_cited_rate": 0.333,
                                     "false_refusals": 2, "uncited_by_llm": 1, "passages_instead": 2}
    assert by_type["multi_note"]["gold_cited"] == 1 and by_type["keyword"]["gold_cited_rate"] == 1.0
    assert by_type["no_answer"]["no_answer_not_answered"] == 2 and by_type["no_answer"]["no_answer_answered_anyway"] == 2


def test_a_legacy_answer_that_is_the_configured_refusal_phrase_counts_as_the_llms_refusal():
    """Answers recorded before the LLM's reply was read (no ``citing``): the configured phrase."""
    pairs = [(question("a", "fact", gold=["g"]), answer("llm_refused", text="Not in my notes."))]
    assert answer_report(pairs, "Not in my notes.")["answerable"]["refused_by_llm"] == 1
    assert answer_report(pairs, REFUSAL)["answerable"]["shown_uncited"] == 1


def test_what_the_llm_wrote_that_the_notes_do_not_bear_out_shown_as_a_refusal_is_counted_so():
    """The LLM wrote an answer of its own (uncited), the passages were not about the question:
    the person saw the refusal and the closest notes (outcome llm_refused)."""
    pairs = [(question("a", "fact", gold=["g"]), answer("llm_refused", text=REFUSAL, closest=["g"], citing="uncited")),
             (question("n", "no_answer"), answer("llm_refused", text=REFUSAL, closest=["x"], citing="partly"))]
    r = answer_report(pairs, REFUSAL)
    assert r["answerable"]["false_refusals"] == 1 and r["answerable"]["refusal_after_llm"] == 1
    assert r["answerable"]["shown_uncited"] == 0 and r["answerable"]["gold_cited"] == 0
    assert r["no_answer"]["not_answered"] == 1 and r["no_answer"]["answered_anyway"] == 0


def test_what_an_answer_says_is_read_against_the_evidence_it_was_given():
    q = {**question("a", "fact", gold=["g"]), "question": "皮蛋要放几颗？",
         "answer_points": ["皮蛋 2 颗", "大米 150ml"]}
    good = answer("llm", text="放 2 颗皮蛋[1]。", cited=["g"], citing="inferred")
    good.trace.reply = "放 2 颗皮蛋[1]。皮蛋要放 3 颗。"
    good.trace.standalone = "皮蛋要放几颗？"
    good.trace.evidence = {"1": "[1] 皮蛋瘦肉粥\n大米 150ml，饮用水 1 升，皮蛋 2 颗。"}
    good.quote = "> 笔记原文 [1] 皮蛋瘦肉粥\n> 大米 150ml，饮用水 1 升，皮蛋 2 颗。"  # the note's words under it
    bad = answer("llm", text="皮蛋要放 3 颗[1]。", cited=["g"], citing="cited")
    bad.trace.reply, bad.trace.standalone, bad.trace.evidence = bad.answer, "皮蛋要放几颗？", good.trace.evidence
    r = answer_report([(q, good), (q, bad)], REFUSAL)
    rows = r["rows"]
    assert (rows[0]["reply_saying"], rows[0]["reply_supported"], rows[0]["reply_invented"]) == (2, 1, ["3 颗"])
    assert (rows[0]["shown_saying"], rows[0]["shown_unsupported"], rows[0]["points_stated"]) == (1, 0, 1)
    assert rows[0]["wrong_cited"] is False
    # shown as it was (a pipeline that did not check): the invented number counts, as a wrong claim shown cited
    assert rows[1]["shown_invented"] == ["3 颗"] and rows[1]["contradicted"] == ["3 颗"] and rows[1]["wrong_cited"]
    says = r["says"]
    assert (says["reply_units"], says["reply_units_supported"], says["shown_units"], says["shown_units_unsupported"]) \
        == (3, 1, 2, 1)
    assert (says["points"], says["points_stated"], says["wrong_cited"]) == (4, 1, 1)
    # with the note's words quoted under the good answer, its second point is shown too
    assert rows[0]["points_shown"] == 2 and rows[1]["points_shown"] == rows[1]["points_stated"] == 0
    assert (says["points_shown"], says["points_shown_rate"]) == (2, 0.5)


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([10, 30, 20], 95) == 29.0


# --- the reader stand-in ------------------------------------------------------------------


def block(n: int, title: str, text: str) -> Evidence:
    return Evidence(n, f"note{n}", title, "nb", "", "u", text, 1.0)


BLOCKS = [
    block(1, "番茄炒蛋", "一定要先把鸡蛋炒好盛出。再下番茄。"),
    block(2, "支付接口调用的重试策略", "失败后最多重试 3 次。指数退避，第一次等待 200 毫秒，之后翻倍。"),
]


def chat(fake: FakeOllama, prompt: list[dict], **kwargs) -> tuple[str, Usage]:
    model = OllamaChat(OllamaConfig(host=fake.url, timeout=10.0))
    usage = Usage()

    async def run():
        return "".join([p async for p in model.stream(prompt, usage=usage, **kwargs)])

    return asyncio.run(run()), usage


def test_the_reader_quotes_the_block_sharing_most_question_terms_with_its_number():
    with FakeOllama(reader=True, speed=(50_000.0, 5_000.0)) as fake:
        prompt = messages("付款失败以后第一次重试前要等待多久？", BLOCKS, REFUSAL)
        text, usage = chat(fake, prompt)
        assert text == "指数退避，第一次等待 200 毫秒，之后翻倍。[2]"
        # the speed simulation and Ollama's counts still work
        assert usage.prompt_tokens == fake_tokens("\n".join(m["content"] for m in prompt))
        assert usage.output_tokens > 0 and usage.output_seconds > 0
        text, _ = chat(fake, messages("鸡蛋什么时候下锅", BLOCKS, REFUSAL))
        assert text.endswith("[1]") and "鸡蛋炒好盛出" in text
        # a tie goes to the first block: the best ranked
        tied = [block(1, "a", "鸡蛋先炒。"), block(2, "b", "鸡蛋后放。")]
        assert chat(fake, messages("鸡蛋什么时候下锅", tied, REFUSAL))[0] == "鸡蛋先炒。[1]"


def test_the_reader_refuses_with_the_system_prompts_phrase_when_no_block_shares_a_term():
    with FakeOllama(reader=True) as fake:
        assert chat(fake, messages("Who won the 1998 World Cup?", BLOCKS, REFUSAL))[0] == REFUSAL
        assert chat(fake, messages("Who won the 1998 World Cup?", BLOCKS, "Not in my notes."))[0] == "Not in my notes."


def test_a_scripted_reply_wins_over_the_reader_and_without_reader_nothing_changes():
    with FakeOllama(reader=True) as fake:
        fake.reply("脚本", "[1]")
        assert chat(fake, messages("鸡蛋什么时候下锅", BLOCKS, REFUSAL))[0] == "脚本[1]"
    with FakeOllama() as fake:
        assert chat(fake, messages("鸡蛋什么时候下锅", BLOCKS, REFUSAL))[0] == "(no reply scripted)"


def test_a_format_request_gets_json_in_the_schema_made_of_the_question():
    question = "把一串字节复制几次才能送出去，有没有办法少拷贝几次？"
    prompt = [{"role": "system", "content": EXPAND_SYSTEM}, {"role": "user", "content": question}]
    for reader in (True, False):
        with FakeOllama(reader=reader) as fake:
            text, _ = chat(fake, prompt, format=SCHEMA)
            assert fake.structured_chats()[-1]["format"] == SCHEMA
        data = json.loads(text)
        assert set(data) == {"terms", "answer"}
        assert data["answer"] == question and data["terms"] == [question]  # the stand-in repeats the question
        assert parse(text).answer == question


# --- the command, end to end --------------------------------------------------------------


def note(path: str) -> str:
    return stable_id(f"file:{path}")


RETRY, PORT, JOURNAL, PORK = (note("编程/Python/支付接口重试.md"), note("运维/Docker Compose部署短链服务.md"),
                              note("English/Reading systemd journal logs.md"), note("生活/菜谱/红烧肉.md"))
QUESTIONS = [  # examples/FACTS.md
    {"id": "retry", "type": "paraphrase", "question": "付款请求失败以后，第一次重新发起前要停顿多久？", "gold_note_ids": [RETRY]},
    {"id": "port", "type": "keyword", "question": "短网址服务在主机上对外开放的是哪个端口？", "gold_note_ids": [PORT]},
    # a note this user must not see: here the one the reader cites, so the count is seen to count
    {"id": "journal", "type": "fact", "question": "How do I watch one service's log output in real time as new entries show up?",
     "gold_note_ids": [JOURNAL], "trap_note_ids": [JOURNAL]},
    {"id": "pork", "type": "paraphrase", "question": "妈妈教的那道五花肉要小火焖多长时间？", "gold_note_ids": [PORK]},
    {"id": "cup", "type": "no_answer", "question": "Who won the 1998 FIFA World Cup?", "gold_note_ids": []},
    {"id": "later", "type": "fact", "question": "短链服务后来换成哪个端口了？", "gold_note_ids": [PORT], "after_changes": True},
]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The sample notes indexed once through the CLI, and the question file."""
    tmp = tmp_path_factory.mktemp("answer_eval")
    shutil.copytree(EXAMPLES, tmp / "notes")
    base = "source:\n  kind: files\n  path: notes\nstate_dir: data\nrerank:\n  kind: none\n"
    (tmp / "base.yaml").write_text(base, encoding="utf-8")
    assert main(["--config", str(tmp / "base.yaml"), "index"]) == 0
    questions = tmp / "dev.jsonl"
    questions.write_text("".join(json.dumps({"user_id": "local", **q}, ensure_ascii=False) + "\n" for q in QUESTIONS),
                         encoding="utf-8")
    return tmp, base, questions


def configure(sample, name: str, ollama: str) -> str:
    tmp, base, _ = sample
    path = tmp / name
    path.write_text(base + ollama, encoding="utf-8")
    return str(path)


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_eval_answers_with_the_reader_stand_in(sample, capsys):
    with FakeOllama(reader=True) as fake:
        config = configure(sample, "reader.yaml", f"ollama:\n  host: {fake.url}\n")
        code, out, _ = run(capsys, "--config", config, "eval", "--answers", str(sample[2]), "--json")
        prompts = [fake_tokens("\n".join(m["content"] for m in c["messages"])) for c in fake.chats()
                   if "format" not in c]  # answers, not query expansions
    assert code == 0
    r = json.loads(out)
    assert r["questions"] == 5 and r["skipped_after_changes"] == 1
    assert r["llm"]["model"] == "qwen2.5:7b-instruct" and r["llm"]["through_daemon"] is False
    assert r["outcomes"] == {"llm": 4, "llm_passages": 0, "refused": 1, "fallback": 0, "extractive": 0}
    assert r["answerable"]["n"] == 4 and r["answerable"]["gold_cited_by_llm"] == 4
    assert r["answerable"]["llm_cited"] == 4 and r["answerable"]["false_refusals"] == 0
    assert r["no_answer"]["refused_before_llm"] == 1 and r["no_answer"]["answered_anyway"] == 0
    assert r["traps"]["cited"] == 1
    rows = {row["id"]: row for row in r["rows"]}
    assert set(rows) == {"retry", "port", "journal", "pork", "cup"}
    assert rows["port"]["cited"] == [PORT] and "18080" in rows["port"]["answer"]
    assert rows["cup"]["outcome"] == "refused" and rows["cup"]["first_token_ms"] is None
    # the prompt sizes are the fake's own counts, as Ollama reports them, one per answer
    assert [row["prompt_tokens"] for row in r["rows"] if row["prompt_tokens"]] == prompts
    assert r["prompt_tokens"]["source"] == "ollama" and r["latency_ms"]["first_token"]["n"] == 4

    with FakeOllama(reader=True) as fake:
        config = configure(sample, "reader.yaml", f"ollama:\n  host: {fake.url}\n")
        code, out, _ = run(capsys, "--config", config, "eval", "--answers", str(sample[2]))
    assert code == 0
    assert "answerable        4          4  1.000       4        0        0         0" in out
    assert "the LLM's replies: cited 4, cited by inference 0, refused 0, uncited 0" in out
    assert "no_answer         1  not answered 1 (refused before the LLM 1, after it 0, passages instead 0), answered anyway 0" in out
    assert "trap notes cited: 1" in out and "(as Ollama reported them)" in out
    assert "(1 after_changes questions left out" in out


@pytest.mark.slow
def test_eval_answers_without_an_llm_and_with_changes(sample, capsys):
    config = configure(sample, "nollm.yaml", "ollama:\n  enabled: false\n")
    code, out, _ = run(capsys, "--config", config, "eval", "--answers", str(sample[2]), "--json", "--with-changes")
    assert code == 0
    r = json.loads(out)
    assert r["llm"] is None and r["questions"] == 6 and r["skipped_after_changes"] == 0
    assert r["outcomes"]["extractive"] == 5 and r["outcomes"]["refused"] == 1
    assert r["latency_ms"]["first_token"]["n"] == 0 and r["prompt_tokens"] == {"n": 0, "p50": None, "p95": None,
                                                                            "source": None}


def test_eval_answers_rejects_a_bad_file_and_bad_usage(sample, capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "user_id": "local", "gold_note_ids": "n1"}\n'
                   '{"question": "q", "user_id": "local"}\n', encoding="utf-8")
    config = configure(sample, "nollm.yaml", "ollama:\n  enabled: false\n")
    code, out, err = run(capsys, "--config", config, "eval", "--answers", str(bad))
    assert code == 2 and out == ""
    assert f"{bad}:1: 'gold_note_ids' must be a list" in err and f"{bad}:2: needs a non-empty 'id' string" in err
    assert run(capsys, "--config", config, "eval")[0] == 2
    assert run(capsys, "--config", config, "eval", str(sample[2]), "--answers", str(sample[2]))[0] == 2
    assert run(capsys, "--config", config, "eval", "--answers", str(sample[2]), "--retriever", "dense")[0] == 2
    assert run(capsys, "--config", config, "eval", "--answers", str(tmp_path / "missing.jsonl"))[0] == 2
