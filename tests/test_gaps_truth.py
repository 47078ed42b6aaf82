"""Gaps and drafts that tell the truth, below the chat doors: why a gap is kept as the person saw
it, the note begun with ✍️ that ends (refused, expired, its gap dismissed, cancelled), a
question typed while it waits, what ``/gaps`` says with nothing open and in which time zone,
and the words under the list on each platform."""

from __future__ import annotations

import asyncio
import time

import pytest

from rag.answer.gaps import GapStore
from rag.answer.types import Answer, Trace

from bot.chat.gaps import gaps_text
from bot.root import Parts
from bot.usecases import gaps
from bot.usecases.capture import NoCapture
from bot.usecases.people import Person

from conftest import make_settings


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def answer_with(outcome: str, citing: str = "") -> Answer:
    trace = Trace(question="q", standalone="q")
    trace.outcome, trace.citing = outcome, citing
    return Answer("q", "", used_llm=bool(citing), grounded=False, trace=trace)


def test_a_gap_keeps_why_as_the_person_was_told():
    """The LLM found nothing (the passages shown under "the model found no direct answer"): not
    found; the LLM's answer was not backed by the notes (withdrawn, whether passages or the
    refusal came instead): withdrawn. Before, the outcome alone decided, and the two came out
    swapped."""
    assert gaps.why_gap(answer_with("refused")) == "refused"  # before the LLM: nothing relevant
    assert gaps.why_gap(answer_with("llm_passages", "refused")) == "refused"
    assert gaps.why_gap(answer_with("llm_passages", "nothing")) == "refused"
    assert gaps.why_gap(answer_with("llm_refused", "uncited")) == "withdrawn"
    assert gaps.why_gap(answer_with("llm_refused", "partly")) == "withdrawn"
    assert gaps.why_gap(answer_with("llm_passages", "uncited")) == "withdrawn"
    assert gaps.why_gap(answer_with("llm_refused", "refused")) == "refused"
    for backed in ("llm", "extractive", "fallback", "listing"):
        assert gaps.why_gap(answer_with(backed, "cited")) is None


@pytest.fixture
def world(tmp_path):
    clock = Clock(time.time())
    settings = make_settings(tmp_path, users=[{"leanote_user_id": "u", "telegram_ids": [1],
                                               "timezone": "Asia/Shanghai"},
                                              {"leanote_user_id": "u", "telegram_ids": [2]}],
                             capture={"draft_wait": "10m"})
    with Parts(settings, clock=clock) as parts:
        yield parts, clock


def test_a_draft_ends_after_its_wait_when_its_gap_is_dismissed_and_when_its_write_is_refused(world):
    parts, clock = world
    me = Person("telegram:1", "u")
    store = parts.gaps
    gap_id, _ = store.add(me.key, "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
    other, _ = store.add(me.key, "u", "nginx 限流", "nginx 限流", [0.0, 1.0], "refused")
    gaps.write(parts, me, gap_id, "telegram:1")
    clock.now += 9 * 60
    assert gaps.take_draft(parts, me, "telegram:1").gap_id == gap_id  # still waiting
    clock.now += 2 * 60
    assert gaps.take_draft(parts, me, "telegram:1") is None  # capture.draft_wait (10 min) passed
    # ✍️ then ✖ on the same gap: the next message is not that gap's note
    gaps.write(parts, me, gap_id, "telegram:1")
    gaps.dismiss(parts, me, gap_id)
    assert gaps.take_draft(parts, me, "telegram:1") is None
    # cancelled: only the draft of that gap, and it says which
    gaps.write(parts, me, other, "telegram:1")
    assert gaps.end_draft(parts, me, gap_id="nope") is None
    assert gaps.take_draft(parts, me, "telegram:1") is not None
    assert gaps.end_draft(parts, me, gap_id=other).title == "nginx 限流"
    assert gaps.take_draft(parts, me, "telegram:1") is None

    # a write that fails (here: this process does not write captures) ends the draft as well
    gaps.write(parts, me, other, "telegram:1")
    draft = gaps.take_draft(parts, me, "telegram:1")
    with pytest.raises(NoCapture):
        asyncio.run(gaps.write_draft(parts, me, draft, "limit_req zone=one burst=10"))
    assert gaps.take_draft(parts, me, "telegram:1") is None


@pytest.mark.parametrize("text", [
    "番茄炒蛋怎么做？", "怎么给 nginx 配置限流", "Redis 持久化是什么", "how do I reload nginx", "What is HPA?",
    "溏心蛋要煮几分钟吗", "可以用 docker 跑 nacos 吗",
])
def test_a_question_while_a_draft_waits_is_told_apart(text):
    assert gaps.looks_like_question(text)


@pytest.mark.parametrize("text", [
    "limit_req_zone $binary_remote_addr zone=one:10m rate=5r/s;",
    "水开后放鸡蛋，煮 6 分钟，捞出过冷水。",
    "用 limit_req 限流：\n1. 定义 zone\n2. location 里 limit_req zone=one burst=10\n这样问题就解决了？",
    "Use limit_req in the location block, burst=10.",
    "ok",
])
def test_a_note_while_a_draft_waits_is_taken_as_the_note(text):
    assert not gaps.looks_like_question(text)


def test_gaps_say_the_truth_with_none_open_and_times_in_the_persons_zone(world):
    parts, clock = world
    me, friend = Person("telegram:1", "u"), Person("telegram:2", "u")
    # nothing kept (never, or after /forget): not "every question you asked was answered"
    empty = gaps_text(gaps.shown(parts, me)).text
    assert "answered" not in empty.replace("answered by", "") and "No knowledge gaps kept" in empty
    assert "/forget" in empty
    clock.now = 1_767_225_600.0  # 2026-01-01 00:00 UTC: 08:00 in Shanghai
    gap_id, _ = parts.gaps.add(me.key, "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
    parts.gaps.add(friend.key, "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
    listed = gaps_text(gaps.shown(parts, me)).text
    assert "01-01 08:00" in listed  # users[].timezone: Asia/Shanghai
    theirs = gaps_text(gaps.shown(parts, friend)).text
    assert "01-01 00:00 UTC" in theirs  # no zone set: UTC, and said so
    # a digest plan set in chat with a zone: that zone
    from bot.usecases import digest

    digest.set_plan(parts, friend, "daily 08:30 Europe/Berlin")
    assert "01-01 01:00" in gaps_text(gaps.shown(parts, friend)).text
    # dismissed: none open, and it says what became of them
    gaps.dismiss(parts, me, gap_id)
    none_open = gaps_text(gaps.shown(parts, me)).text
    assert "No open knowledge gaps" in none_open and "1 dismissed" in none_open
    assert "every question" not in none_open


def test_the_words_under_the_list_fit_the_platform(world):
    parts, clock = world
    me = Person("telegram:1", "u")
    parts.gaps.add(me.key, "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
    telegram = gaps_text(gaps.shown(parts, me)).text
    discord = gaps_text(gaps.shown(parts, me), how="note").text
    assert "your next message" in telegram and "/note" not in telegram.splitlines()[-1]
    assert "your next /note" in discord and "what you send next" not in discord and "message" not in \
        discord.splitlines()[-1]


def test_the_store_clock_is_the_parts_clock(tmp_path):
    clock = Clock(1000.0)
    with Parts(make_settings(tmp_path), clock=clock) as parts:
        assert isinstance(parts.gaps, GapStore) and parts.gaps.clock is clock


# --- one pipeline: a command line pass closes what a daemon pass would ------------------------------

NGINX = ("# Nginx rate limiting\n\nTo configure rate limiting in nginx, define a zone with limit_req_zone "
         "$binary_remote_addr zone=one:10m rate=5r/s; and use limit_req zone=one burst=10 in the location.\n")


@pytest.mark.slow
def test_a_command_line_index_closes_the_gaps_a_daemon_pass_would(tmp_path, capsys):
    import json
    import shutil

    from bot.cli import main
    from conftest import EXAMPLES, THREADS

    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("source:\n  kind: files\n  path: notes\nstate_dir: data\nollama: {enabled: false}\n"
                   f"rerank: {{kind: none}}\nembedder: {{threads: {THREADS}}}\n")
    assert main(["--config", str(cfg), "index"]) == 0
    assert main(["--config", str(cfg), "ask", "How do I configure nginx rate limiting?"]) == 0
    (notes / "运维" / "nginx.md").write_text(NGINX)
    assert main(["--config", str(cfg), "index"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "gaps", "--json", "--state", "closed"]) == 0
    closed = json.loads(capsys.readouterr().out)
    assert [(g["wordings"], g["note_title"]) for g in closed] == [
        (["How do I configure nginx rate limiting?"], "Nginx rate limiting")]


# --- a digest that tells the truth ------------------------------------------------------------------

LIMITS = ("# Nginx 限流配置\n\nnginx 限流用 limit_req_zone 定义 zone，在 location 里写 limit_req zone=one burst=10。"
          "排查过的问题见《Nginx 限流排查记录》。\n")
TROUBLE = ("# Nginx 限流排查记录\n\nnginx limit_req 限流后返回 503：burst 太小，调到 burst=20 nodelay。"
           "配置方法见《Nginx 限流配置》。\n")


@pytest.mark.slow
def test_a_digest_after_a_first_index_tells_added_and_edited_as_the_index_saw_them(tmp_path):
    """A folder copied in a moment ago (every file's time is now) and indexed: the digest lists
    none of its notes (they are what the notes were, neither new nor edited). Then one edited,
    three added: exactly those, each as what it is; two that name each other in 《》 are linked."""
    import os
    import shutil

    from bot.usecases import digest as digest_case
    from conftest import EXAMPLES

    notes = tmp_path / "notes"
    shutil.copytree(EXAMPLES, notes)
    now = time.time()
    for f in notes.rglob("*"):
        if f.is_file():
            os.utime(f, (now, now))
    settings = make_settings(tmp_path, source={"kind": "files", "path": str(notes)}, ollama={"enabled": False},
                             rerank={"kind": "none"})
    me = Person("telegram:1", "local")
    with Parts(settings, create=True) as parts:
        since = time.time() - 1  # a plan made before the first index (the config's, at the daemon's start)
        parts.sync.run_pass(False, True)
        first = digest_case.compose(parts, me, since, time.time() + 1)
        assert first.changed == [] and first.this_day == []  # a folder's ids say nothing of when a note was made
        egg = notes / "生活" / "菜谱" / "番茄炒蛋.md"
        egg.write_text(egg.read_text() + "\n\n出锅前加一小勺糖提鲜。\n")
        (notes / "运维" / "nginx.md").write_text(NGINX)
        (notes / "运维" / "限流配置.md").write_text(LIMITS)
        (notes / "运维" / "限流排查.md").write_text(TROUBLE)
        parts.sync.run_pass(False, True)
        later = digest_case.compose(parts, me, since, time.time() + 1)
        assert sorted((c["title"], c["kind"]) for c in later.changed) == [
            ("Nginx rate limiting", "added"), ("Nginx 限流排查记录", "added"), ("Nginx 限流配置", "added"),
            ("番茄炒蛋", "edited")]
        titles = {n["note_id"]: n["title"] for n in parts.memory_to_read.shown_notes("local")}
        related = {frozenset((titles[a], titles[b])) for a, b, _ in parts.memory_to_read.best_pairs("local", 500)}
        quoting = frozenset(("Nginx 限流配置", "Nginx 限流排查记录"))
        assert quoting in related  # related, and they name each other: not "not linked yet"
        assert quoting not in {frozenset((p["a"]["title"], p["b"]["title"])) for p in later.pairs}
        assert later.pairs  # others are still shown
        # a week on, nothing changed since: nothing to say about changes
        assert digest_case.compose(parts, me, time.time() + 1, time.time() + 2).changed == []


def test_forget_takes_the_persons_questions_out_of_the_feedback_too_and_says_so(world):
    """/forget: the person's gaps, draft and plan, and the answers kept for feedback (their
    questions, verdicts and reasons), not kept 180 days more; another person's stay."""
    from bot.chat.gaps import forgot_text

    parts, _ = world
    me, friend = Person("telegram:1", "u"), Person("telegram:2", "u")
    for who in (me, friend):
        parts.gaps.add(who.key, "u", "怎么煮溏心蛋", "怎么煮溏心蛋", [1.0, 0.0], "refused")
        answer_id = parts.feedback.record(who.key, who.user_id, answer_with("refused"), f"telegram:1:{who.key}")
        parts.feedback.verdict(answer_id, who.key, "down", "没找到")
    gone = gaps.forget(parts, me)
    assert (gone.gaps, gone.answers) == (1, 1)
    assert [r["person"] for r in parts.feedback.export()] == [friend.key]
    said = forgot_text(gone)
    assert "1" in said and "feedback" in said
    assert (gaps.forget(parts, friend).answers, parts.feedback.export()) == (1, [])
