"""What one person's messages may cost the doors (issue 53 item 6): a clip or a photo over the
person's rate limit is refused before it is fetched (no download, no transcription, then "Easy
there"); the "in line" messages of many clips are edited at a pace that grows with the time waited,
not with its square; a ``/gaps`` reply that meets Telegram's flood limit (429, ``retry_after``) waits
it out and arrives whole, with its buttons, as answers do. The doors are the real bots on the fake
Bot API and the fake Discord; the pace is checked in virtual time (no test waits on the clock)."""

from __future__ import annotations

import asyncio

import pytest

from bot.chat.pacing import LINE_EDIT_EVERY, LINE_EDIT_MOST, Coalesced

from conftest import until
from fakes.telegram import visible


# --- the "in line" messages' pace -------------------------------------------------------------------

class VirtualTime:
    """A clock and a sleep that only move when the test says so."""

    def __init__(self):
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, future))
        try:
            await future
        finally:
            self.sleepers = [s for s in self.sleepers if s[1] is not future]

    async def advance(self, to: float) -> None:
        while True:
            due = sorted((s for s in self.sleepers if s[0] <= to and not s[1].done()), key=lambda s: s[0])
            if not due:
                break
            self.now = max(self.now, due[0][0])
            due[0][1].set_result(None)
            for _ in range(10):
                await asyncio.sleep(0)
        self.now = to
        for _ in range(10):
            await asyncio.sleep(0)


def in_line(n: int, job: float) -> tuple[list[list[tuple[float, int]]], int]:
    """``n`` clips of one person join the line at once, each taking ``job`` seconds; every message is told
    how many are ahead as that falls (the line's ``on_wait``), then its turn (0), then closed. What each
    message showed (time, number), and how many edits being told at each change would have made."""
    time = VirtualTime()
    shown: list[list[tuple[float, int]]] = [[] for _ in range(n)]

    async def main():
        messages = []
        for i in range(n):
            async def show(value, i=i):
                shown[i].append((time.now, value))
            messages.append(Coalesced(show, clock=time.clock, sleep=time.sleep))
        for i, m in enumerate(messages):  # they join: each told how many are ahead
            await (m(i) if i else m.now(0))
        for k in range(1, n + 1):  # a clip is done: every later one has one fewer ahead
            await time.advance(k * job)
            for i in range(k, n):
                await (messages[i](i - k) if i - k else messages[i].now(0))
            await messages[k - 1].close()
        await time.advance(n * job + 600)

    asyncio.run(main())
    return shown, sum(1 + i for i in range(n))


@pytest.mark.parametrize("job", [2.0, 10.0, 30.0])
def test_thirty_clips_in_line_are_edited_with_the_time_waited_not_the_square_of_the_clips(job):
    """Told at each change: one edit per clip ahead per message, 465 for 30 clips, however fast the
    line moves. Paced: each message says its number again at most once per ``LINE_EDIT_EVERY`` seconds
    for each clip that was ahead when it last said it (at most ``LINE_EDIT_MOST``): far back in line it
    speaks when its number has fallen by a good part, near the front every few seconds; the chat's
    edits stay under one a second (Telegram's pace for a chat); each message's last word is its turn."""
    n = 30
    shown, told = in_line(n, job)
    edits = sum(len(s) for s in shown)
    assert told == 465
    times = sorted(t for s in shown for t, _ in s[1:])
    assert all(sum(1 for t in times if a <= t < a + 60) < 60 for a in times), times  # under one a second
    if job <= 2.0:
        assert edits <= 2 * n, edits  # a quick line: its first word and its turn
    assert edits < told, edits
    assert all(s[-1][1] == 0 for s in shown)  # the last word: its turn came, never a stale number after it
    for s in shown:
        for (t0, said), (t1, _) in zip(s, s[1:-1]):  # between two numbers (the turn is said at once)
            assert t1 - t0 >= min(LINE_EDIT_MOST, LINE_EDIT_EVERY * max(1, said)) - 1e-9, s
        numbers = [v for _, v in s]
        assert numbers == sorted(numbers, reverse=True)  # it only counts down
    if job == 30.0:  # a slow line: near the front the count is seen to fall, far back now and then
        assert [v for _, v in shown[4]] == [4, 3, 2, 1, 0], shown[4]
        assert len(shown[29]) >= 10, shown[29]


# --- the rate limit before a download: Telegram ------------------------------------------------------

pytest.importorskip("faster_whisper")

import test_telegram_capture  # noqa: E402
from test_telegram import run  # noqa: E402
from test_telegram_capture import OWNER  # noqa: E402

world = test_telegram_capture.world


@pytest.mark.slow
def test_telegram_clips_and_photos_over_the_rate_limit_are_refused_before_they_are_fetched(world):
    make, tg, ollama, leanote = world
    settings = make()
    settings = settings.model_copy(update={"bots": settings.bots.model_copy(update={"rate_limit": 2})})

    async def scenario(daemon):
        before = len(tg.sent_to(OWNER))
        for i in range(4):
            tg.add_file(f"clip-{i}", b"OggS" + bytes(400))  # (no audio in it: refused quickly once fetched)
            tg.send_voice(OWNER, f"clip-{i}", duration=2)
        tg.add_file("photo-1", b"\x89PNG\r\n\x1a\n" + bytes(100))
        tg.send_photo(OWNER, "photo-1", caption="这张图里写的是什么？")
        said = await until(lambda: [visible(m["text"]) for m in tg.sent_to(OWNER)[before:]
                                    if "Easy there" in visible(m["text"])], 60, "the refusals")
        await until(lambda: len([m for m in tg.sent_to(OWNER)[before:] if "Easy there" in visible(m["text"])]) == 3,
                    60, "three refusals")
        assert all("2 questions a minute" in s for s in said)
        # the two let through are fetched in their turn (the refusals may come first); the others never are
        await until(lambda: len(tg.downloads) >= 2, 60, "the two clips let through fetched")
        assert sorted(tg.downloads) == ["clip-0", "clip-1"]  # the others never fetched, so never heard or read

    run(settings, tg, scenario)


# --- /gaps meets a flood limit half-way ---------------------------------------------------------------

import test_gaps_doors  # noqa: E402
from test_gaps_doors import FRIEND, Q_EN, mid, new_message, open_gaps  # noqa: E402

tg_world, dc_world = test_gaps_doors.tg_world, test_gaps_doors.dc_world


@pytest.mark.slow
def test_telegram_gaps_that_meet_a_flood_limit_arrive_whole_with_their_buttons(tg_world):
    settings, tg, leanote, notes, ollama = tg_world
    from bot.telegram import service as telegram_service

    async def scenario(daemon):
        tg.say(FRIEND, Q_EN)
        await until(lambda: open_gaps(daemon, f"telegram:{FRIEND}"), what="the gap kept")
        gap = open_gaps(daemon, f"telegram:{FRIEND}")[0]
        before = len(tg.sent_to(FRIEND))
        tg.throttle_next("sendMessage", times=1, retry_after=1)  # Telegram: 429, retry after 1 s
        tg.say(FRIEND, "/gaps")
        listed = await new_message(tg, FRIEND, before, "What your notes could not answer")
        assert tg.buttons(mid(tg, listed)) == [("✍️ 1", f"gap:w:{gap.id}"), ("✖ 1", f"gap:x:{gap.id}")]
        assert not [m for m in tg.sent_to(FRIEND)[before:] if "出错" in m["text"] or "went wrong" in m["text"]]
        assert any(c[0] == "sendMessage" for c in tg.calls) and tg.throttle["sendMessage"][0] == 0

    test_gaps_doors.run(settings, scenario, telegram_service, lambda: tg.method_calls("getUpdates"))


@pytest.mark.slow
def test_discord_gaps_that_meet_a_rate_limit_arrive_whole_with_their_buttons(dc_world):
    settings, fake, notes = dc_world
    from bot.discord import service as discord_service
    from test_gaps_doors import GUILD, ONE, said, slash

    async def scenario(daemon):
        slash(fake, ONE, "ask", {"question": Q_EN})
        await until(lambda: open_gaps(daemon, f"discord:{ONE}"), what="the gap kept")
        gap = open_gaps(daemon, f"discord:{ONE}")[0]
        fake.throttle_next("callback", times=1, retry_after=0.5)  # Discord: 429 to the response, retry after 0.5 s
        it = await said(fake, ONE, "gaps")
        assert "What your notes could not answer" in it.texts()[-1]
        assert [b.get("custom_id") for b in it.buttons()] == [f"gap:w:{gap.id}", f"gap:x:{gap.id}"]
        assert fake.throttle["callback"][0] == 0  # it met the limit, and waited it out

    test_gaps_doors.run(settings, scenario, discord_service, lambda: fake.ready and fake.commands_for(GUILD))


# --- the rate limit before a download: Discord --------------------------------------------------------

import test_discord_capture  # noqa: E402

discord_world = test_discord_capture.world


@pytest.mark.slow
def test_discord_clips_over_the_rate_limit_are_refused_before_they_are_downloaded(discord_world):
    from test_discord_capture import CHANNEL, GUILD, ONE, ROLE, reply, run as discord_run

    fake = discord_world.fake
    settings = discord_world.settings()
    settings = settings.model_copy(update={"bots": settings.bots.model_copy(update={"rate_limit": 1})})

    async def scenario(daemon):
        said = []
        for i in range(3):
            clip = fake.upload(f"clip-{i}.ogg", b"OggS" + bytes(400), "audio/ogg", channel_id=CHANNEL)
            it = fake.slash(ONE, "ask", {"file": clip}, guild_id=GUILD, channel_id=CHANNEL, roles=[ROLE])
            said.append(await reply(it, f"the reply to clip {i}", timeout=60))
        assert ["Easy there" in s for s in said] == [False, True, True], said
        assert fake.downloads == ["clip-0.ogg"]  # the others never downloaded, so never heard

    discord_run(settings, fake, scenario)
