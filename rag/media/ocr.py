"""Text in an image, read on this machine: ``rapidocr-onnxruntime`` runs the PP-OCRv4
Chinese/English detection and recognition models that ship inside its wheel (Apache-2.0) in
ONNX Runtime. An image is checked before it is read: an image at all (Pillow opens it), within
``media.max_image_mb`` and ``media.max_image_pixels``; it is turned upright as its EXIF says."""

from __future__ import annotations

import io
import logging
import re
import warnings
from importlib import util as import_util

import numpy as np

from rag.media.base import OCR_EXTRA, TooBig, Unreadable

log = logging.getLogger(__name__)

NOT_AN_IMAGE = ("这不是能读的图片（PNG、JPEG、WebP、BMP、GIF…）。 / That is not an image I can read "
                "(PNG, JPEG, WebP, BMP, GIF…).")


def installed() -> str | None:
    """Why OCR cannot work here (the extra is missing), or None."""
    # (looked for, not imported: the daemon starts without loading them)
    if import_util.find_spec("rapidocr_onnxruntime") is None or import_util.find_spec("PIL") is None:
        return (f"图片文字识别没有安装：{OCR_EXTRA} / Reading text in images needs the ocr extra: {OCR_EXTRA}")
    return None


def open_image(data: bytes, max_mb: float, max_pixels: int, decode: bool = True, fit: int | None = None,
               read_pixels: int | None = None):
    """The image, upright and in RGB; ``TooBig`` (too large, too many pixels) or ``Unreadable``
    (not an image) otherwise. The size in pixels is read from the header, before any pixel is
    decoded (``decode`` False: only that check, nothing decoded: a quick refusal before the image
    waits in line). ``fit``: the longest side the reader looks at, ``read_pixels``: the most pixels;
    a larger image is scaled down to both as it is decoded (a JPEG is decoded at a smaller scale),
    so a large image costs its decoded pixels once, not in every copy made of it."""
    from PIL import Image, ImageOps  # the ocr extra's

    if len(data) > max_mb * 1024 * 1024:
        raise TooBig(f"图片太大：最多 {max_mb:g} MB。 / The image is too large: at most {max_mb:g} MB "
                     f"(media.max_image_mb).")
    try:
        with warnings.catch_warnings():
            # Pillow's warning past 89M pixels says nothing ours does not (below); its error past twice that is
            # refused the same way, by the number of pixels it says the header claims
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                image = Image.open(io.BytesIO(data))
            except Image.DecompressionBombError as err:
                said = _PIXELS.search(str(err))
                raise TooBig(too_many_pixels(int(said.group(1)) if said else None, max_pixels)) from err
            width, height = image.size
            if width * height > max_pixels:
                raise TooBig(too_many_pixels(width * height, max_pixels, f"{width}×{height}"))
            if not decode:
                return None
            scale = min(1.0, (fit or max(width, height)) / max(width, height),
                        ((read_pixels or width * height) / (width * height)) ** 0.5)
            if scale < 1.0:
                if image.mode not in _SCALED:
                    image = image.convert("RGB")
                image.thumbnail((max(1, int(width * scale)), max(1, int(height * scale))), Image.Resampling.LANCZOS)
            else:
                image.load()
            image = ImageOps.exif_transpose(image)
            return image.convert("RGB")
    except TooBig:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise Unreadable(NOT_AN_IMAGE) from err


_PIXELS = re.compile(r"\((\d+) pixels\)")
_SCALED = ("L", "LA", "RGB", "RGBA", "CMYK")  # modes scaled down as they are; others made RGB first


def too_many_pixels(pixels: int | None, max_pixels: int, size: str = "") -> str:
    said = size or (f"{pixels:,}" if pixels else f"over {max_pixels:,}")
    return (f"图片像素太多：{said}，最多 {max_pixels:,} 像素。 / The image has too many pixels: {said}, at most "
            f"{max_pixels:,} (media.max_image_pixels).")


def lines_of(result) -> list[str]:
    """RapidOCR's boxes (corner points, text, score) as lines in reading order: boxes whose
    vertical middles are within half a line of each other are one line, read left to right."""
    boxes = []
    for points, text, _score in result or ():
        ys = [p[1] for p in points]
        xs = [p[0] for p in points]
        boxes.append(((min(ys) + max(ys)) / 2, max(ys) - min(ys), min(xs), text.strip()))
    boxes.sort()
    lines: list[list[tuple]] = []
    for box in boxes:
        if lines and abs(box[0] - lines[-1][0][0]) <= max(box[1], lines[-1][0][1]) / 2:
            lines[-1].append(box)
        else:
            lines.append([box])
    out = []
    for line in lines:
        words = [b[3] for b in sorted(line, key=lambda b: b[2]) if b[3]]
        if words:
            out.append(" ".join(words))
    return out


class RapidReader:
    """PP-OCRv4 (Chinese and English) through RapidOCR, ``threads`` threads."""

    name = "rapidocr"

    def __init__(self, threads: int = 2, max_mb: float = 10.0, max_pixels: int = 40_000_000,
                 read_pixels: int = 2_400_000):
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)
        self.max_mb, self.max_pixels, self.read_pixels = max_mb, max_pixels, read_pixels

    def read(self, data: bytes) -> list[str]:
        # scaled to the longest side RapidOCR reads at (it scales a larger image down to it itself) and to
        # ``read_pixels``: its text detector's memory grows with the pixels (media.ocr_pixels)
        image = open_image(data, self.max_mb, self.max_pixels, fit=self.engine.max_side_len,
                           read_pixels=self.read_pixels)
        bgr = np.asarray(image)[:, :, ::-1].copy()
        result, _ = self.engine(bgr)
        return lines_of(result)


def sample() -> bytes:
    """A small PNG with "OK 42" drawn in it (``doctor`` reads it)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (240, 80), "white")
    ImageDraw.Draw(image).text((20, 16), "OK 42", fill="black", font_size=40)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()
