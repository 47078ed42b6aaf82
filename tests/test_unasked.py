"""A message that asks nothing ("Remind me to call the dentist…", said or typed): a voice memo
ran the LLM for 25 s and became a knowledge gap. Now it is not answered as a question, is no
gap, and the reply offers "Save as note"; real questions, imperatives that ask among them
("告诉我怎么备份", "explain how backups work"), are answered as before. The rule itself
(``rag.answer.intent``) on English and Chinese, and on the dev questions: none is caught."""

from __future__ import annotations

import json

import pytest

from rag.answer.intent import not_a_question

from conftest import SHARED

NOT_QUESTIONS = [
    "Remind me to call the dentist tomorrow at 9", "Remind me to call the dentist when I get home.",
    "Hey, remind me tomorrow to renew the domain", "Can you remind me to call the dentist?", "Don't forget the milk",
    "Remember to water the plants", "Note to self: the spare key is under the mat", "todo: renew the TLS cert",
    "Set an alarm for 7", "Wake me up at 6:30", "提醒我明天下午三点给牙医打电话", "提醒我给妈妈打电话",
    "请提醒我下班去取快递", "别忘了带伞", "记得明天交房租", "记一下：明天买牛奶", "帮我定个闹钟，明早七点", "明早叫我起床",
    "你能提醒我明天去看牙医吗？", "待办：续费域名", "备忘：车停在 B2",
]
QUESTIONS = [
    "告诉我怎么备份", "explain how backups work", "Remind me what the Wi-Fi password is",
    "Remind me how to renew the cert", "remind me the wifi password", "remind me of the backup schedule",
    "提醒我一下上次那个报错", "提醒我一下备份怎么做", "提醒我一下，nginx 的配置文件在哪个目录", "记得我上次写的 nginx 配置吗",
    "记得吗", "Remind me, when does the backup run?", "Note to self: what did I name the bucket?",
    "Don't forget: how do I restart caddy?", "how do I back up", "备份脚本在哪", "Tell me about the backup",
    "call the dentist", "列出所有 systemd 服务的配置", "炸酱面哪几步可以并行", "西红柿鸡蛋汤放多少水",
]


@pytest.mark.parametrize("text", NOT_QUESTIONS)
def test_a_reminder_or_a_to_do_is_not_a_question(text):
    assert not_a_question(text) == "reminder"


@pytest.mark.parametrize("text", QUESTIONS)
def test_a_question_is_one_even_an_imperative_or_one_that_starts_like_a_reminder(text):
    assert not_a_question(text) is None


def test_no_dev_question_is_taken_for_a_reminder():
    path = SHARED / "eval" / "dev.jsonl"
    if not path.exists():
        pytest.skip("the shared dev questions are not here")
    questions = [json.loads(line)["question"] for line in path.read_text(encoding="utf-8").splitlines() if line]
    assert len(questions) >= 50 and [q for q in questions if not_a_question(q)] == []


def test_what_is_kept_for_the_button_is_bounded_and_each_persons_own(tmp_path):
    """Kept for "Save as note": a person's newest PER_PERSON, MOST in all, none older than KEEP;
    another person's id is gone for the presser."""
    from types import SimpleNamespace

    from bot.usecases import unasked
    from bot.usecases.people import Person

    parts = SimpleNamespace(unasked={})
    now = [1000.0]
    alice, bob = Person(user_id="u1", key="telegram:1"), Person(user_id="u1", key="telegram:2")
    assert unasked.check(parts, alice, "how do I back up?", clock=lambda: now[0]) is None  # a question: nothing kept
    kept = [unasked.check(parts, alice, f"remind me to water plant {i}", clock=lambda: now[0]) for i in range(7)]
    assert sorted(u.id for u in parts.unasked.values()) == sorted(u.id for u in kept[-unasked.PER_PERSON:])
    assert unasked.kept(parts, alice, kept[-1].id).text == "remind me to water plant 6"
    with pytest.raises(unasked.Gone):
        unasked.kept(parts, bob, kept[-1].id)
    now[0] += unasked.KEEP + 1
    unasked.check(parts, bob, "别忘了带伞", clock=lambda: now[0])
    assert [u.person for u in parts.unasked.values()] == ["telegram:2"]


def test_forget_takes_the_words_kept_for_the_button_too():
    """/forget: what a person said that asked nothing is not kept for "Save as note" after it
    (another person's stays)."""
    from types import SimpleNamespace

    from bot.usecases import gaps, unasked
    from bot.usecases.people import Person

    parts = SimpleNamespace(unasked={}, gaps_if_made=lambda: None, feedback_if_made=lambda: None)
    alice, bob = Person(user_id="u1", key="telegram:1"), Person(user_id="u1", key="telegram:2")
    mine = unasked.check(parts, alice, "remind me to call the dentist tomorrow")
    theirs = unasked.check(parts, bob, "别忘了带伞")
    gaps.forget(parts, alice)
    with pytest.raises(unasked.Gone):
        unasked.kept(parts, alice, mine.id)
    assert unasked.kept(parts, bob, theirs.id).text == "别忘了带伞"
