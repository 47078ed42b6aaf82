"""A clip's bytes as 16 kHz mono samples (PyAV: its wheel carries FFmpeg's decoders, so
Telegram's OGG/Opus, MP3, M4A and WAV decode without a system ffmpeg), and a long clip cut
into pieces at its pauses."""

from __future__ import annotations

import io

import numpy as np

from rag.media.base import TooLong, Unreadable

RATE = 16_000
_FRAME = RATE // 10  # 100 ms: the unit a cut is looked for in


def decode(data: bytes, max_seconds: float) -> np.ndarray:
    """The clip as float32 samples at 16 kHz, mono. ``TooLong`` as soon as the decoding passes
    ``max_seconds`` (a long file is not decoded to the end to be refused); ``Unreadable`` for
    what no decoder takes."""
    import av  # the speech extra's (the daemon starts without it loaded)

    limit = int(max_seconds * RATE) + RATE // 2  # half a second of grace for a clip "of" the limit
    chunks, total = [], 0
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise Unreadable(_UNREADABLE)
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    part = out.to_ndarray().reshape(-1)
                    chunks.append(part)
                    total += part.size
                if total > limit:
                    raise TooLong(too_long(max_seconds))
            for out in resampler.resample(None):
                part = out.to_ndarray().reshape(-1)
                chunks.append(part)
                total += part.size
    except (av.error.FFmpegError, ValueError, IndexError, EOFError) as err:
        raise Unreadable(_UNREADABLE) from err
    if total > limit:
        raise TooLong(too_long(max_seconds))
    if total == 0:
        raise Unreadable(_UNREADABLE)
    return np.concatenate(chunks).astype(np.float32, copy=False)


_UNREADABLE = ("这个文件读不出声音（不是能解码的音频）。 / That file could not be decoded as audio "
               "(OGG/Opus, MP3, M4A, WAV… work).")


def too_long(max_seconds: float) -> str:
    return (f"太长了：语音最长 {max_seconds:g} 秒（media.max_clip）。 / Too long: voice messages of at most "
            f"{max_seconds:g} s are transcribed (media.max_clip).")


def pieces(samples: np.ndarray, piece_seconds: float) -> list[np.ndarray]:
    """The clip in pieces of at most ``piece_seconds``, each cut at the quietest 100 ms of its
    last third (a pause between words, where there is one), so no word is split if it can be
    helped."""
    size = int(piece_seconds * RATE)
    out, start = [], 0
    while samples.size - start > size:
        window = samples[start + size - size // 3: start + size]
        frames = window[: window.size // _FRAME * _FRAME].reshape(-1, _FRAME)
        quietest = int(np.argmin((frames ** 2).mean(axis=1))) if frames.size else frames.shape[0]
        cut = start + size - size // 3 + quietest * _FRAME + _FRAME // 2
        out.append(samples[start:cut])
        start = cut
    out.append(samples[start:])
    return out
