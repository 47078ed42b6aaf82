"""The media core alone: the one line media work waits in (people take turns, a long clip
goes in pieces, an error or a cancel reaches only its own job), how a clip is cut, how its
words are tidied, what a transcript asks for, the refusals before any work, and what is
said when an extra is missing. Steps are real threads held by events, not timers."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import numpy as np
import pytest

from rag.media import audio, ocr, speech
from rag.media.base import NotInstalled, TooBig, TooLong, Unreadable
from rag.media.media import Media
from rag.media.queue import Line
from rag.sections_chat import MediaConfig

from bot.usecases.media import spoken


def held(log: list, name: str, gate: threading.Event | None = None):
    def step():
        if gate is not None:
            assert gate.wait(30), f"{name} was never let go"
        log.append(name)
        return name
    return step


def until(check, timeout: float = 30.0) -> bool:
    """True once ``check()`` holds (the line's threads get there on their own; a generous deadline)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def job(person: str, steps: int, log: list, gates: dict):
    """A job of ``steps`` steps; step i waits for ``gates[(person, i)]`` when there is one."""
    got = []
    for i in range(1, steps + 1):
        got.append((yield held(log, f"{person}{i}", gates.get((person, i)))))
    return got


def test_people_take_turns_a_step_at_a_time_and_each_hears_how_many_are_ahead():
    line, log, told = Line(), [], {"b": [], "c": []}
    gates = {("a", 1): threading.Event()}
    long = line.submit("a", job("a", 3, log, gates))  # a long clip: three pieces
    # while a's first piece runs, b and c each send a short one
    short_b = line.submit("b", job("b", 1, log, {}), lambda n: told["b"].append(n))
    short_c = line.submit("c", job("c", 1, log, {}), lambda n: told["c"].append(n))
    gates[("a", 1)].set()
    assert long.result(30) == ["a1", "a2", "a3"] and short_b.result(30) == ["b1"] and short_c.result(30) == ["c1"]
    # b and c each waited for one piece of a's, never for the whole of it
    assert log == ["a1", "b1", "c1", "a2", "a3"]
    assert told["b"] == [1, 0] and told["c"] == [2, 1, 0]
    line.close()


def test_a_short_clip_runs_beside_a_long_clips_piece_instead_of_waiting_for_it():
    line, log, told = Line(), [], {"b": [], "c": [], "d": []}
    gates = {("a", 1): threading.Event(), ("b", 1): threading.Event(), ("c", 1): threading.Event()}
    long = line.submit("a", job("a", 3, log, gates))  # a long clip: three pieces, the first held
    assert until(lambda: line.running is not None)
    # b's short clip starts at once beside a's piece, and is never told it waits
    short_b = line.submit("b", job("b", 1, log, gates), lambda n: told["b"].append(n), quick=True)
    assert until(lambda: line.quick is not None and line.quick.person == "b")
    # c's short clip waits: the quick lane is b's; d's long clip waits for the main lane
    short_c = line.submit("c", job("c", 1, log, gates), lambda n: told["c"].append(n), quick=True)
    long_d = line.submit("d", job("d", 2, log, {}), lambda n: told["d"].append(n))
    assert told["b"] == [0] and told["c"] == [2] and told["d"] == [3]
    gates[("b", 1)].set()
    assert short_b.result(30) == ["b1"]
    assert until(lambda: line.quick is not None and line.quick.person == "c")  # the next short one, beside a
    assert log == ["b1"]  # b was done while a's first piece still ran
    gates[("c", 1)].set()
    assert short_c.result(30) == ["c1"] and log == ["b1", "c1"] and told["c"] == [2, 0]
    gates[("a", 1)].set()
    assert long.result(30) == ["a1", "a2", "a3"] and long_d.result(30) == ["d1", "d2"]
    assert log[2:] == ["a1", "d1", "a2", "d2", "a3"]  # the long ones still take turns piece by piece
    line.close()


def test_a_short_clip_behind_another_short_one_waits_and_a_persons_jobs_keep_their_order():
    line, log = Line(), []
    gates = {("a", 1): threading.Event(), ("b", 1): threading.Event()}
    first = line.submit("a", job("a", 1, log, gates), quick=True)  # a short clip holds the main lane
    second = line.submit("b", job("b", 1, log, gates), quick=True)
    assert until(lambda: line.running is not None)
    assert line.quick is None  # no second lane beside a short clip
    gates[("b", 1)].set()
    gates[("a", 1)].set()
    assert first.result(30) == ["a1"] and second.result(30) == ["b1"] and log == ["a1", "b1"]
    # a's long clip and then a's short one: the short one waits for a's own long one
    gate = threading.Event()
    long = line.submit("a", job("a", 2, log, {("a", 1): gate}))
    assert until(lambda: line.running is not None)
    short = line.submit("a", job("a", 1, log, {}), quick=True)
    assert line.quick is None
    gate.set()
    assert long.result(30) == ["a1", "a2"] and short.result(30) == ["a1"] and log[2:] == ["a1", "a2", "a1"]
    line.close()


def test_a_persons_own_jobs_keep_their_order_and_an_error_or_a_cancel_reaches_only_its_job():
    line, log = Line(), []
    gate = threading.Event()

    def failing():
        yield held(log, "x1", gate)
        raise Unreadable("not audio")

    first = line.submit("a", failing())
    second = line.submit("a", job("a", 1, log, {}))
    dropped = line.submit("b", job("b", 1, log, {}))
    assert dropped.cancel()  # the person left before their turn
    gate.set()
    with pytest.raises(Unreadable):
        first.result(30)
    assert second.result(30) == ["a1"] and log == ["x1", "a1"]
    line.close()


def test_the_event_loop_hears_its_place_in_line_and_gets_the_result():
    line, log, told = Line(), [], []
    gate = threading.Event()
    line.submit("a", job("a", 1, log, {("a", 1): gate}))

    async def main():
        async def on_wait(n):
            told.append(n)
            if n:
                gate.set()
        return await line.run("b", job("b", 2, log, {}), on_wait)

    assert asyncio.run(main()) == ["b1", "b2"] and told == [1, 0]
    line.close()


def test_a_long_clip_is_cut_at_its_pauses_into_pieces_no_longer_than_asked():
    rng = np.random.default_rng(7)
    samples = rng.uniform(-0.5, 0.5, audio.RATE * 40).astype(np.float32)
    quiet = slice(int(12.2 * audio.RATE), int(12.6 * audio.RATE))  # a pause in the last third of the first 15 s
    samples[quiet] = 0
    pieces = audio.pieces(samples, 15)
    assert all(p.size <= 15 * audio.RATE for p in pieces) and len(pieces) in (3, 4)
    assert quiet.start <= pieces[0].size <= quiet.stop  # cut inside the pause
    assert np.array_equal(np.concatenate(pieces), samples)
    assert len(audio.pieces(samples[: 5 * audio.RATE], 15)) == 1


def test_a_transcript_says_what_it_asks_for():
    assert spoken("Note, buy a new router.") == ("note", "buy a new router.")
    assert spoken("记一下：周五交报告") == ("note", "周五交报告")
    assert spoken("Remember, the parking spot is B2.") == ("remember", "the parking spot is B2.")
    assert spoken("记住，车位号是 B2-117") == ("remember", "车位号是 B2-117")
    assert spoken("How do I read the system journal?") == ("ask", "How do I read the system journal?")
    assert spoken("notebooks are where?")[0] == "ask"  # a word that starts with "note" is not the command


def test_words_are_tidied_loops_cut_to_one_and_chinese_simplified():
    assert speech.tidy("好的 好的 好的 好的 好的 我们开会", "en") == "好的 我们开会"
    assert speech.tidy("thank you. thank you. thank you. thank you.", "en") == "thank you."
    assert speech.tidy("下午快到雲余余余余余余余余", "zh") == "下午快到雲余" and speech.tidy("哈哈哈", "zh") == "哈哈哈"
    pytest.importorskip("opencc")
    from opencc import OpenCC
    assert speech.tidy("這個報錯記住了", "zh", OpenCC("t2s").convert) == "这个报错记住了"


def test_what_is_too_long_too_large_or_no_audio_or_image_is_refused_before_any_model_loads(tmp_path):
    pytest.importorskip("av")
    pytest.importorskip("PIL")
    import media_files

    with pytest.raises(TooLong, match="at most 1 s"):
        audio.decode(media_files.tone(2.0), max_seconds=1.0)
    samples = audio.decode(media_files.tone(2.0), max_seconds=60)
    assert abs(samples.size / audio.RATE - 2.0) < 0.1
    with pytest.raises(Unreadable, match="could not be decoded as audio"):
        audio.decode(b"RIFF....WAVEfmt " + b"\x00" * 200, max_seconds=60)
    with pytest.raises(TooBig, match="too many pixels"):
        ocr.open_image(media_files.text_png(["x"], width=400), max_mb=1, max_pixels=10_000)
    with pytest.raises(TooBig, match="at most 0.001 MB"):
        ocr.open_image(media_files.text_png(["x"]), max_mb=0.001, max_pixels=10 ** 8)
    with pytest.raises(Unreadable, match="not an image"):
        ocr.open_image(b"\x89PNG\r\n\x1a\nnot really", max_mb=1, max_pixels=10 ** 8)
    media = Media(MediaConfig(max_audio_mb=0.001), tmp_path)
    with pytest.raises(TooBig, match="media.max_audio_mb"):
        asyncio.run(media.hear("a", b"x" * 2000))
    assert not media._engines  # nothing was loaded for a refusal
    media.close()


def test_without_the_extras_the_part_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # as if never installed
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    media = Media(MediaConfig(), tmp_path)
    assert "pip install 'leanote-rag[speech]'" in media.speech_problem() and "faster-whisper" in media.speech_problem()
    assert "pip install 'leanote-rag[ocr]'" in media.ocr_problem()
    with pytest.raises(NotInstalled, match=r"leanote-rag\[speech\]"):
        asyncio.run(media.hear("a", b"x"))
    found = {name: (state, fix) for name, state, _, fix in media.check()}
    assert found == {"voice messages (speech)": ("missing", "pip install 'leanote-rag[speech]'"),
                     "photos (ocr)": ("missing", "pip install 'leanote-rag[ocr]'")}
    off = Media(MediaConfig.model_validate({"speech": False, "ocr": "off"}), tmp_path)  # YAML's bare off
    assert "media.speech: off" in off.speech_problem() and [s for _, s, _, _ in off.check()] == ["off", "off"]
    media.close()
    off.close()


@pytest.mark.slow
def test_the_model_is_joined_once_from_its_two_packages_and_checked(tmp_path):
    if speech.installed():
        pytest.skip(speech.installed())
    folder = speech.model_folder(tmp_path / "models")
    assert sorted(p.name for p in folder.iterdir()) == [".checked", "config.json", "model.bin", "tokenizer.json",
                                                        "vocabulary.txt"]
    made = (folder / "model.bin").stat().st_mtime_ns
    assert speech.model_folder(tmp_path / "models") == folder and (folder / "model.bin").stat().st_mtime_ns == made
    # a model.bin that is not the one checked is joined again
    (folder / ".checked").write_text("something else\n")
    speech.model_folder(tmp_path / "models")
    assert (folder / ".checked").read_text().strip() == speech.MODEL_SHA256


@pytest.mark.slow
def test_two_clips_heard_at_the_same_time_each_get_their_own_words(tmp_path):
    """The quick lane runs a short clip beside a long clip's piece: the real model heard from two
    threads at once (faster-whisper's two workers) keeps each clip's words apart."""
    import media_files

    if speech.installed() or not media_files.has_espeak():
        pytest.skip(speech.installed() or "espeak-ng is not installed")
    media = Media(MediaConfig(language="en"), tmp_path)
    engine = media._engine("speech")
    long = audio.decode(media_files.spoken("Restart the web server after you change its configuration file. "
                                           "Check the disk usage before you delete any old logs."), 60)
    short = audio.decode(media_files.spoken("Where is the parking spot?"), 60)
    start, heard = threading.Barrier(2), {}

    def hear(name, samples):
        start.wait(30)
        heard[name] = engine.transcribe(samples, "en")[0].lower()

    threads = [threading.Thread(target=hear, args=(name, samples)) for name, samples in (("long", long), ("short", short))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert "web server" in heard["long"] and "disk usage" in heard["long"] and "parking" not in heard["long"]
    assert "parking" in heard["short"] and "server" not in heard["short"]
    media.close()


# --- a clip that claims little and holds hours ------------------------------------------------

DECODE_IN_A_CHILD = """
import json, resource, sys
sys.path[:0] = sys.argv[1:3]
import media_files
from rag.media import audio
from rag.media.base import MediaError
data = media_files.matroska_pcm(*json.loads(sys.argv[3]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# a safety net for the box: past 1.5 GB more the decoding fails here instead of taking the machine's memory
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (1536 << 20), resource.RLIM_INFINITY))
try:
    audio.decode(data, 60)
    said = "decoded"
except MediaError as err:
    said = f"{type(err).__name__}: {err}"
except BaseException as err:  # MemoryError: what the limit above turns the old decoding into
    said = f"{type(err).__name__}: {err}"
print(json.dumps({"size": len(data), "said": said,
                  "grew_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def decoded_in_a_child(*bomb) -> dict:
    """``audio.decode`` of ``media_files.matroska_pcm(*bomb)`` in a process of its own: what it said, and
    how much its peak memory (ru_maxrss) grew while decoding."""
    import json
    import subprocess
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", DECODE_IN_A_CHILD, str(tests), str(tests.parent), json.dumps(bomb)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("bomb, why", [
    ((1, 5_000_000, 1000), "its header says 83 minutes"),
    ((1, 5_000_000, 1000, 5.0), "its header lies (5 s), its one block says 83 minutes"),
    ((4000, 1000, 1000, 5.0), "its header lies (5 s), and it holds 4,000 one-second blocks"),
])
def test_an_audio_decode_bomb_is_refused_as_too_long_with_its_memory_bounded(bomb, why):
    """A 10 MB Matroska file holding 5,000,000 samples at 1000 Hz (83 minutes, sent as a 5-second
    voice message) took the daemon past its 2 GB before it was refused: now its length is read
    before anything is decoded, and the decoding stops as soon as it passes the limit."""
    pytest.importorskip("av")
    got = decoded_in_a_child(*bomb)
    assert got["said"].startswith("TooLong") and "at most 60 s" in got["said"], (why, got)
    assert got["grew_mb"] < 100, (why, got)  # (it grew by 1.85 GB before)


def test_a_clip_whose_header_says_it_is_too_long_is_refused_before_it_waits_and_one_that_lies_in_its_turn(tmp_path):
    """The decoding is done in the media line, one at a time: only a header is read before."""
    pytest.importorskip("av")
    import media_files

    media = Media(MediaConfig(), tmp_path)
    gate = threading.Event()
    media.line.submit("someone", job("someone", 1, [], {("someone", 1): gate}), quick=True)  # the line is busy
    assert until(lambda: media.line.running is not None)

    async def main():
        # said at once, from its header: it never joins the line
        with pytest.raises(TooLong, match="at most 60 s"):
            await media.hear("a", media_files.matroska_pcm(1, 5_000_000, 1000))
        assert media.line.ahead() == 1
        # its header says 5 s: it waits its turn, and is decoded (and refused) only then
        told = []

        async def on_wait(n):
            told.append(n)

        lying = asyncio.create_task(media.hear("a", media_files.matroska_pcm(4000, 1000, 1000, claims=5.0), on_wait))
        deadline = time.monotonic() + 30
        while not told and not lying.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        refused_at_once, ahead = lying.done(), media.line.ahead()  # (before: decoded and refused before it joined)
        gate.set()
        assert not refused_at_once and told == [1] and ahead == 2
        with pytest.raises(TooLong, match="at most 60 s"):
            await lying
        assert told == [1, 0]

    try:
        asyncio.run(main())
    finally:
        gate.set()
    assert not media._engines  # nothing was loaded for a refusal
    media.close()


def test_a_quick_job_that_turns_out_long_leaves_the_quick_lane_after_its_first_step():
    from rag.media.queue import LONG

    line, log = Line(), []
    gates = {("a", 1): threading.Event(), ("a", 2): threading.Event()}
    long = line.submit("a", job("a", 3, log, gates))
    assert until(lambda: line.running is not None)

    def liar():  # said it was one step (a header of a short clip); its first step found more
        yield held(log, "b1")
        yield LONG
        yield held(log, "b2")
        yield held(log, "b3")
        return "b"

    b = line.submit("b", liar(), quick=True)
    assert until(lambda: log == ["b1"])  # its first step ran beside a's piece
    c = line.submit("c", job("c", 1, log, {}), quick=True)
    assert until(lambda: log == ["b1", "c1"])  # the quick lane is free again: b's rest waits for the main one
    gates[("a", 1)].set()
    gates[("a", 2)].set()
    assert long.result(30) == ["a1", "a2", "a3"] and b.result(30) == "b" and c.result(30) == ["c1"]
    assert log[2:] == ["a1", "b2", "a2", "b3", "a3"]  # b's pieces take turns with a's
    line.close()


# --- images past the pixel limit ------------------------------------------------------------------

@pytest.mark.parametrize("claims, said", [
    (("png", 40_000, 40_000), "1,600,000,000"),  # past Pillow's own bomb limit (179M pixels)
    (("jpeg", 65_500, 65_500), "4,290,250,000"),
    (("png", 10_000, 10_000), "10000×10000"),  # past Pillow's warning (89M pixels)
    (("png", 7_000, 7_000), "7000×7000"),  # past ours alone
])
def test_an_image_whose_header_claims_too_many_pixels_is_refused_as_that_not_as_no_image(claims, said):
    pytest.importorskip("PIL")
    import media_files

    kind, width, height = claims
    data = (media_files.png_claiming if kind == "png" else media_files.jpeg_claiming)(width, height)
    for decode in (False, True):
        with pytest.raises(TooBig, match="too many pixels") as refused:
            ocr.open_image(data, max_mb=10, max_pixels=40_000_000, decode=decode, fit=2000)
        assert said in str(refused.value) and "at most 40,000,000" in str(refused.value)


def test_a_large_image_is_scaled_to_what_the_reader_looks_at_as_it_is_decoded():
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    for fmt, size in (("PNG", (4800, 1200)), ("JPEG", (1200, 4800)), ("TIFF", (3000, 3000))):
        buf = io.BytesIO()
        Image.new("L" if fmt == "TIFF" else "RGB", size, "white").save(buf, fmt)
        image = ocr.open_image(buf.getvalue(), max_mb=10, max_pixels=40_000_000, fit=2000)
        assert max(image.size) == 2000 and image.mode == "RGB", (fmt, image.size)
        assert image.size[0] / image.size[1] == pytest.approx(size[0] / size[1], rel=0.01)
    square = io.BytesIO()  # at most read_pixels too: what the text detector's memory grows with
    Image.new("RGB", (3000, 3000), "white").save(square, "PNG")
    image = ocr.open_image(square.getvalue(), max_mb=10, max_pixels=40_000_000, fit=2000, read_pixels=2_400_000)
    assert image.size == (1549, 1549)
    phone = io.BytesIO()  # a phone's screenshot: 2,000 on its long side is under read_pixels
    Image.new("RGB", (1080, 2340), "white").save(phone, "PNG")
    assert ocr.open_image(phone.getvalue(), max_mb=10, max_pixels=40_000_000, fit=2000,
                          read_pixels=2_400_000).size == (923, 2000)
    turned = io.BytesIO()  # a phone's photo, stored sideways with its EXIF orientation: scaled, then turned upright
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (4000, 1000), "white").save(turned, "JPEG", exif=exif.tobytes())
    assert ocr.open_image(turned.getvalue(), max_mb=10, max_pixels=40_000_000, fit=2000).size == (500, 2000)
    small = ocr.open_image(media_files_png(), max_mb=10, max_pixels=40_000_000, fit=2000)
    assert small.size == (400, 40 + 36 * 16 // 10)  # a smaller one is left as it is


def media_files_png() -> bytes:
    import media_files

    return media_files.text_png(["x"], width=400)


# --- status messages in flight ----------------------------------------------------------------------

def test_a_status_message_in_flight_is_left_for_the_next_run_only_and_goes_once_settled(tmp_path):
    from rag.media.inflight import InFlight

    first = InFlight(tmp_path / "media.sqlite")
    kept = first.shown("telegram", "telegram:111", {"chat_id": 111, "message_id": 7})
    done = first.shown("telegram", "telegram:111", {"chat_id": 111, "message_id": 8})
    first.shown("discord", "discord:5", {"user_id": 5})
    first.settled(done)
    # a bot that reconnects in the same run: the job of message 7 still runs, nobody is told
    assert first.left("telegram") == []
    first.close()  # a stop, or a kill -9
    second = InFlight(tmp_path / "media.sqlite")
    left = second.left("telegram")
    assert [(s.id, s.person, s.place) for s in left] == [(kept, "telegram:111", {"chat_id": 111, "message_id": 7})]
    second.settled(kept)
    assert second.left("telegram") == [] and [s.person for s in second.left("discord")] == ["discord:5"]
    assert second.forget("discord:5") == 1 and second.left("discord") == []
    second.close()


def test_each_step_of_the_line_is_followed_by_after_step_whatever_its_outcome():
    line, log, after = Line(after_step=lambda: log.append("after")), [], None

    def failing():
        yield held(log, "x1")
        raise Unreadable("not audio")

    def failing_step():
        def step():
            raise Unreadable("not audio")
        yield step

    with pytest.raises(Unreadable):
        line.submit("a", failing()).result(30)
    with pytest.raises(Unreadable):
        line.submit("a", failing_step()).result(30)
    assert line.submit("b", job("b", 2, log, {})).result(30) == ["b1", "b2"]
    assert log == ["x1", "after", "after", "b1", "after", "b2", "after"]
    line.close()


READ_IN_A_CHILD = """
import asyncio, io, json, sys
sys.path[:0] = sys.argv[1:3]
from PIL import Image, ImageDraw
from rag.media.media import Media
from rag.media import ocr
from rag.sections_chat import MediaConfig

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024

image = Image.new("RGB", (2000, 2000), "white")
ImageDraw.Draw(image).text((100, 100), "ConnectionTimeout after 30 seconds", fill="black", font_size=60)
buf = io.BytesIO()
image.save(buf, "PNG")
media = Media(MediaConfig(threads=2), sys.argv[3])
asyncio.run(media.read("a", ocr.sample()))  # the model loaded and warmed up
before = rss()
lines = asyncio.run(media.read("a", buf.getvalue())).lines
print(json.dumps({"lines": lines, "before_mb": before, "after_mb": rss()}))
"""


@pytest.mark.slow
def test_the_memory_an_image_took_is_given_back_once_it_is_read(tmp_path):
    """An OCR of a 2000² image takes about half a gigabyte for seconds; glibc kept it, and the daemon
    stayed that much larger (the next image's or clip's peak on top)."""
    import json
    import subprocess
    from pathlib import Path

    if ocr.installed():
        pytest.skip(ocr.installed())
    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", READ_IN_A_CHILD, str(tests), str(tests.parent), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["lines"] == ["ConnectionTimeout after 30 seconds"]
    assert got["after_mb"] - got["before_mb"] < 60, got
