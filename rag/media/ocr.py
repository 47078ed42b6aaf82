"""Text in an image, read on this machine: ``rapidocr-onnxruntime`` runs the PP-OCRv4
Chinese/English detection and recognition models that ship inside its wheel (Apache-2.0) in
ONNX Runtime. An image is checked before it is read: an image at all (Pillow opens it), within
``media.max_image_mb`` and ``media.max_image_pixels``; it is turned upright as its EXIF says."""

from __future__ import annotations

import io
import logging
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


def open_image(data: bytes, max_mb: float, max_pixels: int, decode: bool = True):
    """The image, upright and in RGB; ``TooBig`` or ``Unreadable`` (not an image) otherwise.
    The size in pixels is read from the header, before any pixel is decoded (``decode`` False:
    only that check, nothing decoded: a quick refusal before the image waits in line)."""
    from PIL import Image, ImageOps  # the ocr extra's

    if len(data) > max_mb * 1024 * 1024:
        raise TooBig(f"图片太大：最多 {max_mb:g} MB。 / The image is too large: at most {max_mb:g} MB "
                     f"(media.max_image_mb).")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise TooBig(f"图片像素太多：{width}×{height}，最多 {max_pixels:,} 像素。 / The image has too many "
                             f"pixels: {width}×{height}, at most {max_pixels:,} (media.max_image_pixels).")
            if not decode:
                return None
            image.load()
            image = ImageOps.exif_transpose(image)
            return image.convert("RGB")
    except TooBig:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise Unreadable(NOT_AN_IMAGE) from err


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

    def __init__(self, threads: int = 2, max_mb: float = 10.0, max_pixels: int = 40_000_000):
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)
        self.max_mb, self.max_pixels = max_mb, max_pixels

    def read(self, data: bytes) -> list[str]:
        image = open_image(data, self.max_mb, self.max_pixels)
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
