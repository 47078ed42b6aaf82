"""A capture made from a message is made once (sync.writeback.capture's ``once``): the same message
again, from the same person into the same Leanote user, writes nothing new and answers with
the first one's receipt; at the same moment, after a restart, without counting against the
rate limit. A capture Leanote refused wrote nothing: the same message again is a new try.
Another person's capture of the same message is theirs. The real Capture and outbox against
the fake Leanote over HTTP."""

from __future__ import annotations

import asyncio

from rag.capture import Attachment

from conftest import capture_alone, make_settings
from test_capture import ME, PERSON, drive, leanote, notes_of  # noqa: F401 (leanote: the fixture)

MESSAGE = "telegram:111:4242"


def settings_for(tmp_path, fake, **capture):
    return make_settings(
        tmp_path, leanote={"base_url": fake.url},
        users=[{"leanote_user_id": ME, "telegram_ids": [111, 222]}],
        capture={"accounts": [{"email": "me@example.com", "password_env": "LR_PW_ME"}],
                 "retry_min": "0.05s", "retry_max": "0.2s", **capture})


def titled(fake, title) -> list[dict]:
    return [n for n in notes_of(fake) if n["Title"] == title]


def test_the_same_message_again_answers_with_the_first_note_also_after_a_restart(tmp_path, leanote):
    settings = settings_for(tmp_path, leanote, rate_limit=1)
    cap = capture_alone(settings)
    try:
        first = drive(cap, cap.note(PERSON, ME, "只记一次的想法", once=MESSAGE))
        again = drive(cap, cap.note(PERSON, ME, "只记一次的想法", once=MESSAGE))  # over the rate limit: not counted
        other = drive(cap, cap.note(PERSON, ME, "另一条", once="telegram:111:4243"))
    finally:
        cap.close()
    assert first.status == "written" and not first.again
    assert again.status == "written" and again.again and again.note_id == first.note_id
    assert "Already saved" in again.message and first.url in again.message and "已记下" not in again.message
    assert other.status == "refused" and "Easy there" in other.message  # a new message does count
    cap = capture_alone(settings)  # a new process: the outbox remembers
    try:
        later = drive(cap, cap.append(PERSON, ME, "只记一次的想法", once=MESSAGE))
    finally:
        cap.close()
    assert later.again and later.note_id == first.note_id
    assert len(titled(leanote, "只记一次的想法")) == 1 and leanote.calls["note/addNote"] == 1


def test_the_same_message_twice_at_once_is_one_note_and_each_press_hears_of_it(tmp_path, leanote):
    cap = capture_alone(settings_for(tmp_path, leanote))

    async def both():
        return await asyncio.gather(*(cap.note(PERSON, ME, "按了两次", once=MESSAGE) for _ in range(2)))

    try:
        receipts = drive(cap, both())
    finally:
        cap.close()
    assert [r.status for r in receipts] == ["written", "written"]
    assert receipts[0].note_id == receipts[1].note_id and sorted(r.again for r in receipts) == [False, True]
    assert len(titled(leanote, "按了两次")) == 1


def test_another_persons_capture_of_the_same_message_is_their_own(tmp_path, leanote):
    cap = capture_alone(settings_for(tmp_path, leanote))
    try:
        mine = drive(cap, cap.note(PERSON, ME, "群里的一条", once="telegram:-100:7"))
        theirs = drive(cap, cap.note("telegram:222", ME, "群里的一条", once="telegram:-100:7"))
    finally:
        cap.close()
    assert not theirs.again and theirs.note_id != mine.note_id
    assert len(titled(leanote, "群里的一条")) == 2


def test_a_message_leanote_refused_is_tried_anew_when_it_comes_again(tmp_path, leanote):
    leanote.max_upload_mb = 0.001  # Leanote refuses the file
    cap = capture_alone(settings_for(tmp_path, leanote))
    photo = [Attachment("photo.jpg", b"\xff\xd8" + b"x" * 4000, "image/jpeg")]
    try:
        refused = drive(cap, cap.note(PERSON, ME, "带图的一条", files=photo, once=MESSAGE))
        assert refused.status == "refused" and [i.state for i in cap.pending(PERSON)] == ["failed"]
        leanote.max_upload_mb = 10  # the owner raised Leanote's limit; the person sends it again
        written = drive(cap, cap.note(PERSON, ME, "带图的一条", files=photo, once=MESSAGE))
        assert cap.pending(PERSON) == []  # the refused one made way for the new try
    finally:
        cap.close()
    assert written.status == "written" and not written.again
    assert len(titled(leanote, "带图的一条")) == 1
