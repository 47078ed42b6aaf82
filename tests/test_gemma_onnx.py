"""EmbeddingGemma through ONNX Runtime (``embedder.backend: onnx``, ``rag.index.gemma_onnx``) on
the tiny stand-in (``gemma_world``): the model exported once beside its folder, whole or not at
all, then loaded from there; the same vectors as torch's under the same model id; a missing
package named with what to install; the options that do not go together refused."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rag.config import EmbedderConfig
from rag.errors import ConfigError, UserError
from rag.index import embed, gemma, gemma_onnx

from conftest import make_settings
from gemma_world import tiny_gemma

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torch")]  # torch imported in one worker of a run

TEXTS = ["红烧肉要炖多久", "猪肉炖一个小时，再放糖和酱油收汁 " * 6, "git rebase rewrites history"]


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("sentence_transformers", reason="needs the [gemma] extra")
    pytest.importorskip("optimum.onnxruntime", reason="needs the [gemma] extra (optimum-onnx)")
    return tiny_gemma(tmp_path_factory.mktemp("gemma") / "embeddinggemma-300m")


def load(folder, **options):
    gemma._gemma_model.cache_clear()  # each load as a new process would make it
    return embed.load(EmbedderConfig(kind="gemma", model=str(folder), threads=1, **options), cache=False)


def listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def test_onnx_is_the_default_and_gives_torchs_vectors_under_the_same_id(gemma_folder):
    model_before = listing(gemma_folder)
    onnx = load(gemma_folder)
    export = gemma_onnx.export_folder(gemma_folder)
    assert (export / "onnx" / "model.onnx").is_file() and (export / gemma_onnx.MARK).is_file()
    assert not list(gemma_folder.parent.glob("*.exporting*"))  # nothing left aside
    assert listing(gemma_folder) == model_before  # the model's own folder is not touched
    torch = load(gemma_folder, backend="torch")
    assert onnx.model_id == torch.model_id  # the same vectors: an index built by one is served by the other
    for side in ("embed", "embed_query"):
        a, b = getattr(onnx, side)(TEXTS), getattr(torch, side)(TEXTS)
        assert a.shape == b.shape == (3, 768) and a.dtype == np.float32
        assert (np.sum(a * b, axis=1) > 0.9999).all()
    one_at_a_time = np.vstack([onnx.embed([t]) for t in TEXTS])  # as the fill embeds: no padding
    assert (np.sum(one_at_a_time * onnx.embed(TEXTS), axis=1) > 0.9999).all()
    cut = load(gemma_folder, dimensions=256)
    assert cut.embed(TEXTS).shape == (3, 256) and cut.model_id == load(gemma_folder, backend="torch",
                                                                         dimensions=256).model_id


def test_the_export_is_made_once_and_then_only_loaded(gemma_folder, monkeypatch):
    load(gemma_folder)
    mark = (gemma_onnx.export_folder(gemma_folder) / gemma_onnx.MARK).read_text()

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(gemma_onnx, "_export", no_export)
    assert load(gemma_folder).embed(["红烧肉"]).shape == (1, 768)
    assert (gemma_onnx.export_folder(gemma_folder) / gemma_onnx.MARK).read_text() == mark


def test_an_interrupted_or_stale_export_is_made_again(gemma_folder, tmp_path):
    folder = tmp_path / "embeddinggemma-300m"
    import shutil

    shutil.copytree(gemma_folder, folder)
    export = gemma_onnx.export_folder(folder)
    aside = folder.parent / f"{export.name}.exporting"
    aside.mkdir()
    (aside / "half.onnx").write_bytes(b"\0" * 100)  # a kill -9 while exporting
    reference = load(folder, backend="torch").embed(TEXTS)
    assert (np.sum(load(folder).embed(TEXTS) * reference, axis=1) > 0.9999).all()
    assert not aside.exists()
    # the weights replaced under the same folder (fetched again, or another model put there): exported again
    (export / gemma_onnx.MARK).write_text("another model\n")
    (export / "onnx" / "model.onnx").write_bytes(b"not a model")
    assert (np.sum(load(folder).embed(TEXTS) * reference, axis=1) > 0.9999).all()
    assert (export / gemma_onnx.MARK).read_text() != "another model\n"


def test_an_export_that_does_not_give_torchs_vectors_is_not_used(gemma_folder, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "embeddinggemma-300m"
    shutil.copytree(gemma_folder, folder)
    monkeypatch.setattr(gemma_onnx, "LEAST_COSINE", 1.01)  # no export can pass: the check is what refuses it
    with pytest.raises(UserError, match="does not give the model's vectors.*embedder.backend: torch"):
        load(folder)
    assert not gemma_onnx.export_folder(folder).exists() and not list(tmp_path.glob("*.exporting"))


def test_missing_onnx_packages_say_what_to_install(tmp_path, monkeypatch):
    folder = tmp_path / "embeddinggemma-300m"
    folder.mkdir()
    (folder / "modules.json").write_text("[]")
    monkeypatch.setitem(sys.modules, "optimum.onnxruntime", None)
    gemma._gemma_model.cache_clear()
    with pytest.raises(UserError, match=r"optimum-onnx.*leanote-rag\[gemma\].*embedder.backend: torch"):
        embed.load(EmbedderConfig(kind="gemma", model=str(folder), threads=1), cache=False)
    assert not gemma_onnx.export_folder(folder).exists()


def test_backend_belongs_to_gemma_and_int8_to_torch(tmp_path):
    with pytest.raises(ConfigError, match="embedder.backend is kind gemma's"):
        make_settings(tmp_path, embedder={"kind": "use", "backend": "onnx"})
    with pytest.raises(ConfigError, match="quantize: int8 is torch's"):
        make_settings(tmp_path, embedder={"kind": "gemma", "backend": "onnx", "quantize": "int8"})
    assert gemma.backend(make_settings(tmp_path, embedder={"kind": "gemma"}).embedder) == "onnx"
    assert gemma.backend(make_settings(tmp_path, embedder={"kind": "gemma", "quantize": "int8"}).embedder) == "torch"
    assert gemma.backend(make_settings(tmp_path, embedder={"kind": "gemma", "backend": "torch"}).embedder) == "torch"
    assert gemma.backend(make_settings(tmp_path).embedder) is None
