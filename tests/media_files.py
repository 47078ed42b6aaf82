"""Small real audio and image files, made at test time: speech by espeak-ng (when the machine
has it), tones and silence by numpy, all encoded as Telegram sends voice (OGG/Opus) by PyAV;
text drawn into PNGs by Pillow."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

RATE = 48_000


def ogg_opus(samples: np.ndarray, rate: int = RATE) -> bytes:
    """Mono float samples as an OGG/Opus file (a Telegram voice message's format)."""
    import av

    if rate != RATE:  # Opus takes 48 kHz: resampled by index (enough for a test's clip)
        samples = np.interp(np.arange(0, samples.size, rate / RATE), np.arange(samples.size), samples)
    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=RATE)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def tone(seconds: float, hz: float = 440.0) -> bytes:
    """A steady tone: sound, but no speech."""
    t = np.arange(int(seconds * RATE)) / RATE
    return ogg_opus(0.3 * np.sin(2 * np.pi * hz * t))


def has_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def spoken(text: str, voice: str = "en") -> bytes:
    """``text`` spoken by espeak-ng, as OGG/Opus."""
    import av

    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "clip.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True, capture_output=True)
        with av.open(str(wav)) as container:
            stream = container.streams.audio[0]
            rate = stream.rate
            samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    if samples.dtype.kind == "i":
        samples = samples.astype(np.float32) / 32768
    return ogg_opus(samples, rate)


def text_png(lines: list[str], size: int = 36, width: int = 900) -> bytes:
    """``lines`` drawn black on white, as a screenshot would show them (DejaVu Sans, else Pillow's own font)."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        font = ImageFont.load_default(size)
    image = Image.new("RGB", (width, 40 + len(lines) * int(size * 1.6)), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((24, 20 + i * int(size * 1.6)), line, fill="black", font=font)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def matroska_pcm(blocks: int, samples: int, rate: int = 1000, claims: float | None = None) -> bytes:
    """A Matroska file of 16-bit PCM at ``rate`` Hz: ``blocks`` blocks of ``samples`` samples of
    silence each (one block of 5,000,000 at 1000 Hz: 83 minutes in 10 MB, a decode bomb). ``claims``:
    the length its header says, in seconds (its Segment's Duration overwritten: a header that lies)."""
    import av
    import struct

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as container:
        stream = container.add_stream("pcm_s16le", rate=rate)
        stream.layout = "mono"
        for n in range(blocks):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), dtype=np.int16), format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, n * samples
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    data = buf.getvalue()
    if claims is not None:  # the Duration element (0x4489, 8-byte float, in the default 1 ms ticks)
        at = data.index(b"\x44\x89\x88") + 3
        data = data[:at] + struct.pack(">d", claims * 1000.0) + data[at + 8:]
    return data


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says ``width``×``height`` (8-bit grey) over a few bytes of pixels: a
    decompression bomb's header, which is all that is read of it."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 100)) + chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A JPEG whose header (its SOF0 segment) says ``width``×``height``, and nothing after it."""
    import struct

    def segment(marker: int, data: bytes) -> bytes:
        return b"\xff" + bytes([marker]) + struct.pack(">H", len(data) + 2) + data

    frame = struct.pack(">BHHB", 8, height, width, 3) + b"".join(struct.pack(">BBB", i, 0x11, 0) for i in (1, 2, 3))
    return (b"\xff\xd8" + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00") + segment(0xC0, frame)
            + b"\xff\xd9")
