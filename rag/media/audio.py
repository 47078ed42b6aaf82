"""A clip's bytes as 16 kHz mono samples (PyAV: its wheel carries FFmpeg's decoders, so
Telegram's OGG/Opus, MP3, M4A and WAV decode without a system ffmpeg), and a long clip cut
into pieces at its pauses.

A clip is judged before it is decoded and while it is: its container's header gives its length,
sample rate and channels (``probe``: a clip whose header says it is too long is refused without
decoding anything), and the decoding keeps a running count (``decode``: each packet's length is
counted before it is decoded, each frame's before it is resampled, and the decoder allocates no
frame longer than what is left of the limit), so a small file that claims little and holds hours
(a Matroska block of 5,000,000 samples at 1000 Hz is 83 minutes in 10 MB) is refused as too long
with its memory bounded by the limit, not by what it holds."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from rag.media.base import TooLong, Unreadable

RATE = 16_000
_FRAME = RATE // 10  # 100 ms: the unit a cut is looked for in
GRACE = 0.5  # seconds over the limit still taken (a clip "of" the limit)
HEADER_SLACK = 1.1  # a header's length may be an estimate (a VBR MP3's): refused from it past this much over
MAX_CHANNELS = 8  # 7.1; a voice clip has one or two
MAX_RATE = 768_000
# the most sample values (samples × channels) one decoded frame may hold: far above any real codec's
# frames (FLAC's longest is 65,535 samples), far below what a forged one could ask for
MAX_FRAME_VALUES = 1 << 22


@dataclass
class Clip:
    """What a clip's container says of it (``seconds`` None: it does not say)."""

    seconds: float | None
    rate: int
    channels: int


def probe(data: bytes, max_seconds: float) -> Clip:
    """The clip's header, nothing decoded: ``Unreadable`` for what no demuxer takes or holds no
    audio we would decode, ``TooLong`` for a header that says it is over ``max_seconds``."""
    import av  # the speech extra's (the daemon starts without it loaded)

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            return _header(container, max_seconds)[1]
    except (av.error.FFmpegError, ValueError, IndexError, EOFError) as err:
        raise Unreadable(_UNREADABLE) from err


def _header(container, max_seconds: float):
    """(the audio stream, what its header says), refused as ``probe`` says."""
    if not container.streams.audio:
        raise Unreadable(_UNREADABLE)
    stream = container.streams.audio[0]
    rate = int(stream.rate or stream.codec_context.sample_rate or 0)
    channels = int(stream.channels or 0)
    if not 0 < rate <= MAX_RATE or not 0 < channels <= MAX_CHANNELS:
        raise Unreadable(_UNREADABLE)
    lengths = []
    if stream.duration and stream.time_base:
        lengths.append(float(stream.duration * stream.time_base))
    if container.duration:
        lengths.append(container.duration / 1_000_000)  # (AV_TIME_BASE)
    seconds = max(lengths) if lengths else None
    if seconds is not None and seconds > (max_seconds + GRACE) * HEADER_SLACK:
        raise TooLong(too_long(max_seconds))
    return stream, Clip(seconds, rate, channels)


def decode(data: bytes, max_seconds: float) -> np.ndarray:
    """The clip as float32 samples at 16 kHz, mono. ``TooLong`` as soon as the decoding passes
    ``max_seconds`` (module docstring: nothing past the limit is decoded or resampled);
    ``Unreadable`` for what no decoder takes."""
    import av

    limit = max_seconds + GRACE
    chunks, total, heard, said = [], 0, 0.0, 0.0
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            stream, clip = _header(container, max_seconds)
            # no frame longer than the limit (or the ceiling) is allocated by the decoder at all
            frame_values = min(MAX_FRAME_VALUES, clip.channels * (int(limit * clip.rate) + 1))
            stream.codec_context.options = {"max_samples": str(frame_values)}
            resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
            for packet in container.demux(stream):
                if packet.duration and packet.time_base:  # its length, said before it is decoded
                    said += float(packet.duration * packet.time_base)
                    if said > limit * HEADER_SLACK:
                        raise TooLong(too_long(max_seconds))
                try:
                    frames = packet.decode()
                except av.error.ArgumentError as err:  # (EINVAL) a frame over max_samples
                    if frame_values < MAX_FRAME_VALUES:
                        raise TooLong(too_long(max_seconds)) from err
                    raise
                for frame in frames:
                    if not frame.sample_rate or frame.samples < 0:
                        raise Unreadable(_UNREADABLE)
                    heard += frame.samples / frame.sample_rate
                    if heard > limit:  # before it is resampled
                        raise TooLong(too_long(max_seconds))
                    for out in resampler.resample(frame):
                        part = out.to_ndarray().reshape(-1)
                        chunks.append(part)
                        total += part.size
            for out in resampler.resample(None):
                part = out.to_ndarray().reshape(-1)
                chunks.append(part)
                total += part.size
    except (av.error.FFmpegError, ValueError, IndexError, EOFError) as err:
        raise Unreadable(_UNREADABLE) from err
    if total > limit * RATE:
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
