"""The daemon's memory with voice and photos at work: a real ``leanote-rag serve`` process, the
Telegram bot on the fake Bot API (tests/fakes/telegram.py), a fake Ollama, the real speech and
OCR engines; its resident memory read from /proc (VmRSS sampled every 20 ms, VmHWM: the kernel's
own peak, reset before each phase through ``/proc/PID/clear_refs``).

    .venv/bin/python bench/media_memory.py            # the shared corpus (indexed first, ~minutes)
    .venv/bin/python bench/media_memory.py --tiny     # the sample notes, the small images only
    .venv/bin/python bench/media_memory.py --set media.max_image_pixels=25000000   # other limits
    .venv/bin/python bench/media_memory.py --state /tmp/mm   # the index kept there, for the next run

Phases, one after the other in the same process (what one has taken and not given back is there
for the next, as in a daemon that has run for a while): the daemon ready; a 55 s voice question
alone (English sentences spoken by espeak-ng, OGG/Opus as Telegram sends voice); each image alone,
with a question as its caption (sent as a file: Telegram keeps its pixels); then each image sent
one second after the clip, so that it is read in the quick lane beside the clip's piece, and that
once more. Images: text drawn on white at the size limit's edge, as an attacker would send them
(the issue's 6000² TIFF of 53 KB, a 6000² WebP, a 6320×6320 RGBA PNG just under 40M pixels, a
6000² JPEG). Reported: each phase's RSS before, its peak and RSS after, the whole run's peak, the
systemd unit's MemoryMax, the machine and its load. Results: ``bench/media_memory_results.json``
(a tiny run's to a temporary folder).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml

from common import BACKUP_NAME, REPO, results_file, shared

sys.path.insert(0, str(REPO / "tests"))
from bot.chat.texts import READING_IMAGE, TRANSCRIBING  # noqa: E402
from conftest import unix_http  # noqa: E402
from fakes.ollama import FakeOllama  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402
from media_eval import ENGLISH, joined, opus, speak  # noqa: E402

EXE = str(Path(sys.executable).with_name("leanote-rag"))
VOICE, PHOTO = 701, 702  # two people: one asks by voice, the other with a photo
USER_ONE = "5dbed2987db161bc2a85b919"
TINY_USER = "local"
WAIT = 900.0


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) // 1024
    return out


class Sampler:
    """VmRSS of the daemon every 20 ms, and VmHWM reset at each phase's start."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self.resettable = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, status(self.pid)["VmRSS"])
            except (OSError, KeyError):
                return

    def phase(self) -> int:
        """A new phase: the peaks reset; the RSS now."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False
        now = status(self.pid)["VmRSS"]
        self.peak = now
        return now

    def end(self) -> dict:
        got = status(self.pid)
        hwm = got["VmHWM"] if self.resettable else None
        return {"peak_mb": max(self.peak, hwm or 0), "vmhwm_mb": hwm, "sampled_peak_mb": self.peak,
                "rss_after_mb": got["VmRSS"]}

    def close(self) -> None:
        self._stop.set()


def draw_image(kind: str, side: tuple[int, int]) -> bytes:
    from PIL import Image, ImageDraw

    mode = "RGBA" if kind == "png_rgba" else "RGB"
    image = Image.new(mode, side, "white")
    draw = ImageDraw.Draw(image)
    for n, line in enumerate(["ConnectionTimeout after 30 seconds", "retry_count exceeded the limit of 3"]):
        draw.text((200, 200 + n * 200), line, fill="black", font_size=120)
    buf = io.BytesIO()
    if kind == "tiff":
        image.save(buf, "TIFF", compression="tiff_deflate")
    elif kind == "webp":
        image.save(buf, "WEBP", quality=60)
    elif kind == "jpeg":
        image.save(buf, "JPEG", quality=70)
    else:
        image.save(buf, "PNG", optimize=True)
    return buf.getvalue()


IMAGES = {"tiff_6000": ("tiff", (6000, 6000), "image/tiff"), "webp_6000": ("webp", (6000, 6000), "image/webp"),
          "png_rgba_6320": ("png_rgba", (6320, 6320), "image/png"), "jpeg_6000": ("jpeg", (6000, 6000), "image/jpeg")}
TINY_IMAGES = {"png_1080x2340": ("png", (1080, 2340), "image/png")}


def config(work: Path, tg: FakeTelegram, ollama: FakeOllama, tiny: bool, sets: list[str],
           state: Path | None) -> tuple[Path, Path, str]:
    sock = Path(f"/tmp/lr-bench-{uuid.uuid4().hex[:8]}.sock")
    user = TINY_USER if tiny else USER_ONE
    source = ({"kind": "files", "path": str(REPO / "examples" / "notes")} if tiny else
              {"kind": "mongodump", "path": str(shared() / "corpus" / "mongodump" / BACKUP_NAME)})
    raw = {"state_dir": str(state or work / "data"), "source": source, "ollama": {"host": ollama.url},
           "api": {"socket": str(sock)}, "memory": {"llm": "off"}, "sync": {"interval": "1h", "watch": False},
           "telegram": {"enabled": True, "token_env": "BENCH_TG", "base_url": tg.base_url},
           "users": [{"leanote_user_id": user, "telegram_ids": [VOICE, PHOTO]}],
           "bots": {"rate_limit": 1000}, "capture": {"max_file_mb": 20}}
    for item in sets:  # --set section.key=value
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path, sock, user


def ready(sock: Path) -> bool:
    try:
        with unix_http(sock) as http:
            reply = http.get("/health", timeout=5)
            return reply.status_code == 200 and reply.json()["passes"] >= 1
    except Exception:  # noqa: BLE001 (not up yet)
        return False


def wait(check, what: str, proc: subprocess.Popen, log: Path, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            raise SystemExit(f"serve exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def settled(tg: FakeTelegram, person: int, before: int):
    """The bot's status message for the person's job (sent after ``before`` of its messages to
    them) once it shows what came of it (the words heard or read, or why not)."""
    sent = tg.sent_to(person)[before:]
    if sent and sent[0]["text"] not in (TRANSCRIBING, READING_IMAGE) and not sent[0]["text"].startswith("⏳"):
        return sent[0]
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the sample notes and one small image (a smoke run)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a config value")
    ap.add_argument("--key", default="default limits", help="the name this run's results are kept under")
    ap.add_argument("--state", type=Path, help="the state folder (the index): kept, and used again by the next run")
    args = ap.parse_args()
    from rag.media import ocr, speech

    missing = speech.installed() or ocr.installed() or (
        "espeak-ng is not installed (apt-get install espeak-ng): it speaks the clip" if shutil.which("espeak-ng") is None
        else None)
    if missing:
        print(json.dumps({"skipped": missing}))
        return 0
    if not args.tiny and not (shared() / "corpus" / "mongodump" / BACKUP_NAME).exists():
        print(f"needs the shared corpus ({shared()}), or --tiny", file=sys.stderr)
        return 2
    clip, _ = joined([speak(t, "en") for t in ENGLISH], ENGLISH, 6 if args.tiny else 55)
    clip_data = opus(clip)
    images = {name: (draw_image(kind, side), mime) for name, (kind, side, mime) in
              (TINY_IMAGES if args.tiny else IMAGES).items()}
    load = [os.getloadavg()]
    phases: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, FakeTelegram() as tg, FakeOllama() as ollama:
        work = Path(tmp)
        path, sock, user = config(work, tg, ollama, args.tiny, args.set, args.state)
        log = work / "serve.log"
        with log.open("w") as err:
            proc = subprocess.Popen([EXE, "--config", str(path), "serve"], stdout=subprocess.DEVNULL, stderr=err,
                                    env={**os.environ, "BENCH_TG": tg.token})
        try:
            wait(lambda: ready(sock) and tg.method_calls("getUpdates"), "the daemon's first pass", proc, log, 3600)
            sampler = Sampler(proc.pid)
            ollama.reply("Use journalctl -f [1].")

            def voice() -> int:
                tg.add_file(f"v-{len(phases)}", clip_data)
                before = len(tg.sent_to(VOICE))
                tg.send_voice(VOICE, f"v-{len(phases)}", duration=int(clip.size / 16_000))
                return before

            def photo(name: str) -> int:
                data, mime = images[name]
                tg.add_file(f"p-{len(phases)}", data)
                before = len(tg.sent_to(PHOTO))
                tg.send_document(PHOTO, f"p-{len(phases)}", f"{name}.{mime.split('/')[1]}", mime,
                                 caption="这个报错我的笔记里有吗？")
                return before

            def phase(name: str, clip: bool, image: str | None) -> None:
                rss = sampler.phase()
                started, shown = time.monotonic(), {}
                if clip:
                    v = voice()
                    if image:
                        time.sleep(1.0)  # the clip's first piece runs; the image is read beside it
                if image:
                    p = photo(image)
                if clip:
                    shown["clip"] = wait(lambda: settled(tg, VOICE, v), "the clip's words", proc, log)["text"]
                if image:
                    shown["image"] = wait(lambda: settled(tg, PHOTO, p), "the image's text", proc, log)["text"]
                took = round(time.monotonic() - started, 1)
                time.sleep(2.0)  # the answers that follow
                row = {"phase": name, "rss_before_mb": rss, **sampler.end(), "seconds": took,
                       "shown": {k: v[:80] for k, v in shown.items()}}
                phases.append(row)
                print(json.dumps(row, ensure_ascii=False), file=sys.stderr, flush=True)

            phases.append({"phase": "ready", "rss_mb": status(proc.pid)["VmRSS"]})
            phase("clip alone", True, None)
            for name in images:
                phase(f"{name} alone", False, name)
            for name in images:
                phase(f"clip + {name}", True, name)
            for name in images:
                phase(f"clip + {name}, again", True, name)
            sampler.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            sock.unlink(missing_ok=True)
        load.append(os.getloadavg())
    unit = (REPO / "systemd" / "leanote-rag.service").read_text()
    cap = re.search(r"^MemoryMax=(\S+)", unit, re.M)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
              "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1),
              "load_avg": {"start": [round(x, 2) for x in load[0]], "end": [round(x, 2) for x in load[-1]]},
              "corpus": "sample notes" if args.tiny else "shared corpus (mongodump)", "set": args.set,
              "clip_s": round(clip.size / 16_000, 1),
              "images": {name: {"bytes": len(data), "type": mime} for name, (data, mime) in images.items()},
              "unit_memory_max": cap.group(1) if cap else None, "exit_code": proc.returncode,
              "peak_mb": max(p.get("peak_mb", 0) for p in phases), "phases": phases}
    out = results_file("media_memory_results.json", args.tiny)
    try:
        runs = json.loads(out.read_text(encoding="utf-8")).get("runs") or {}
    except (OSError, ValueError):
        runs = {}
    runs[args.key] = result
    out.write_text(json.dumps({"runs": runs}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
