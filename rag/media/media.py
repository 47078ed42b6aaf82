"""The media part the composition root builds once: the configured engines (by name, each
loaded on first use, in the line's thread), the one line their work waits in, and what
``doctor`` reports about them."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Awaitable, Callable, Iterator

import numpy as np

from rag.errors import UserError
from rag.media import audio, inflight, ocr, speech
from rag.media.base import OCR_EXTRA, SPEECH_EXTRA, NoSpeech, NoText, NotInstalled, TooBig, Reader, Reading, Transcriber, Transcript
from rag.media.inflight import InFlight
from rag.media.queue import LONG, Line
from rag.sections_chat import MediaConfig

log = logging.getLogger(__name__)

Waiting = Callable[[int], Awaitable[None]]

# name -> (why it cannot work here or None, the engine for (config, models folder))
SPEECH: dict[str, tuple[Callable[[], str | None], Callable[[MediaConfig, Path], Transcriber]]] = {
    "faster-whisper": (speech.installed, lambda cfg, models: speech.WhisperTranscriber(models, cfg.threads)),
}
OCR: dict[str, tuple[Callable[[], str | None], Callable[[MediaConfig, Path], Reader]]] = {
    "rapidocr": (ocr.installed, lambda cfg, models: ocr.RapidReader(cfg.threads, cfg.max_image_mb,
                                                                     cfg.max_image_pixels, cfg.ocr_pixels)),
}
OFF = {"speech": "语音转写已关闭（media.speech: off）。 / Voice messages are turned off (media.speech: off).",
       "ocr": "图片文字识别已关闭（media.ocr: off）。 / Reading images is turned off (media.ocr: off)."}


class Media:
    """Voice and images for one daemon: ``cfg`` (the ``media`` section), the models folder
    (``<state_dir>/models``), the line (its lock file in the state folder), the status messages
    in flight (``in_flight``: ``rag.media.inflight``)."""

    def __init__(self, cfg: MediaConfig, state_dir: Path):
        self.cfg = cfg
        self.state_dir = Path(state_dir)
        self.models = self.state_dir / "models"
        self.line = Line(self.state_dir / "media.lock", after_step=give_back)
        self._engines: dict[str, object] = {}
        self._lock = threading.Lock()
        self._in_flight: InFlight | None = None
        self._closed = False
        self._store_lock = threading.Lock()  # (not the engines': a model loads for seconds under that one)

    # --- what works here ----------------------------------------------------------------------

    def speech_problem(self) -> str | None:
        """Why voice cannot be transcribed here (off, not installed), or None."""
        if self.cfg.speech == "off":
            return OFF["speech"]
        return SPEECH[self.cfg.speech][0]()

    def ocr_problem(self) -> str | None:
        if self.cfg.ocr == "off":
            return OFF["ocr"]
        return OCR[self.cfg.ocr][0]()

    def _engine(self, kind: str):
        """The engine of ``kind``, built once (in the line's thread: loading takes seconds)."""
        with self._lock:
            if kind not in self._engines:
                problem = self.speech_problem() if kind == "speech" else self.ocr_problem()
                if problem:
                    raise NotInstalled(problem)
                table, name = (SPEECH, self.cfg.speech) if kind == "speech" else (OCR, self.cfg.ocr)
                started = time.monotonic()
                self._engines[kind] = table[name][1](self.cfg, self.models)
                log.info("media: %s (%s) loaded in %.1f s", kind, name, time.monotonic() - started)
            return self._engines[kind]

    # --- the work -----------------------------------------------------------------------------

    async def hear(self, person: str, data: bytes, on_wait: Waiting | None = None) -> Transcript:
        """A clip's words: ``NotInstalled``, ``TooBig``, ``TooLong``, ``Unreadable``, ``NoSpeech``
        say why not."""
        problem = self.speech_problem()
        if problem:
            raise NotInstalled(problem)
        if len(data) > self.cfg.max_audio_mb * 1024 * 1024:
            raise TooBig(f"音频文件太大：最多 {self.cfg.max_audio_mb:g} MB。 / The audio file is too large: at most "
                         f"{self.cfg.max_audio_mb:g} MB (media.max_audio_mb).")
        # its header read at once (what is no audio, or says it is too long, is said before it waits);
        # the decoding itself is the job's first step, in the line, one at a time (``audio``: a small
        # file may hold hours)
        clip = await asyncio.to_thread(audio.probe, data, self.cfg.max_clip)
        quick = clip.seconds is not None and clip.seconds <= self.cfg.piece  # need not wait behind a long clip's piece
        return await self.line.run(person, self.hearing(data), on_wait, quick)

    def hearing(self, data: bytes) -> Iterator:
        """The job of hearing a clip: its decoding with its first piece, then a step for each
        other piece. A clip that turns out longer than one piece leaves the quick lane."""
        started = time.monotonic()
        texts, languages = [], Counter()

        def first() -> tuple[np.ndarray, list[np.ndarray], tuple[str, str]]:
            samples = audio.decode(data, self.cfg.max_clip)
            pieces = audio.pieces(samples, self.cfg.piece)
            return samples, pieces, self._engine("speech").transcribe(pieces[0], self.cfg.language)

        samples, pieces, heard = yield first
        if len(pieces) > 1:
            yield LONG
        for n, piece in enumerate(pieces):
            if n:
                heard = yield lambda piece=piece: self._engine("speech").transcribe(piece, self.cfg.language)
            text, language = heard
            if text:
                texts.append(text)
                languages[language] += len(text)
        if not texts:
            raise NoSpeech()
        return Transcript(" ".join(texts), languages.most_common(1)[0][0], samples.size / audio.RATE,
                          time.monotonic() - started)

    async def read(self, person: str, data: bytes, on_wait: Waiting | None = None) -> Reading:
        """An image's text: ``NotInstalled``, ``TooBig``, ``Unreadable`` (not an image), ``NoText``."""
        problem = self.ocr_problem()
        if problem:
            raise NotInstalled(problem)
        self.check_image(data)
        return await self.line.run(person, self.reading(data), on_wait, quick=True)

    def check_image(self, data: bytes) -> None:
        """``TooBig`` or ``Unreadable`` for what is no image or too large, from its header alone:
        refused at once, before it waits in line."""
        ocr.open_image(data, self.cfg.max_image_mb, self.cfg.max_image_pixels, decode=False)

    def reading(self, data: bytes) -> Iterator:
        started = time.monotonic()
        lines = yield lambda: self._engine("ocr").read(data)
        if not lines:
            raise NoText()
        return Reading(lines, time.monotonic() - started)

    # --- doctor -------------------------------------------------------------------------------

    def check(self) -> Iterator[tuple[str, str, str, str]]:
        """(name, state, what was found, the fix) for speech and for OCR; state: "ok" (the
        engine loaded and ran on a tiny sample made here: a second of silence, "OK 42" drawn in
        an image), "off" (turned off in the config), "missing" (the extra is not installed) or
        "broken" (it is, and failed)."""
        for kind, problem in (("speech", self.speech_problem()), ("ocr", self.ocr_problem())):
            name = "voice messages (speech)" if kind == "speech" else "photos (ocr)"
            engine = self.cfg.speech if kind == "speech" else self.cfg.ocr
            if engine == "off":
                yield name, "off", f"off (media.{kind}: off)", ""
                continue
            if problem:
                extra = SPEECH_EXTRA if kind == "speech" else OCR_EXTRA
                yield name, "missing", problem.split(" / ")[-1] + "; the bots say so when one is sent", extra
                continue
            started = time.monotonic()
            try:
                if kind == "speech":
                    self._engine("speech").transcribe(np.zeros(audio.RATE, dtype=np.float32), "en")
                    detail = f"{engine} (Whisper base) loaded and ran in {time.monotonic() - started:.1f} s"
                else:
                    lines = self._engine("ocr").read(ocr.sample())
                    detail = f"{engine} loaded and read {' '.join(lines) or 'nothing'!r} in " \
                             f"{time.monotonic() - started:.1f} s"
            except Exception as err:  # noqa: BLE001 (doctor says what broke, whatever it is)
                yield name, "broken", f"{type(err).__name__}: {err}", f"reinstall the extra: {extra_of(kind)} " \
                    "--force-reinstall"
                continue
            yield name, "ok", detail, ""

    @property
    def in_flight(self) -> InFlight:
        """The status messages shown for jobs that have not ended (made on first use)."""
        with self._store_lock:
            if self._closed:
                raise UserError("the media part is closed (the daemon is stopping)")
            if self._in_flight is None:
                self._in_flight = InFlight(self.state_dir / inflight.FILE)
            return self._in_flight

    def busy(self) -> bool:
        """Is a step (a transcription, an OCR: native code that cannot be stopped) running?"""
        return self.line.busy()

    def close(self) -> None:
        """Jobs waiting are cancelled; a step running ends in its thread (``busy``)."""
        self.line.close()
        with self._store_lock:
            self._closed = True
            if self._in_flight is not None:
                self._in_flight.close()
                self._in_flight = None


def give_back() -> None:
    """What a step freed given back to the system. The engines' buffers (an OCR of a large image
    takes half a gigabyte for a few seconds) are freed into glibc's heaps, which keep them: without
    this the daemon stays at about its largest step's size, and the next step's peak comes on top
    (measured: docs/voice-and-photos.md). Nothing where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def extra_of(kind: str) -> str:
    return SPEECH_EXTRA if kind == "speech" else OCR_EXTRA
