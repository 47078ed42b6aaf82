"""Terms and BM25 sparse vectors, Chinese-aware and friendly to code.

Tokenizing:
- CJK runs go through jieba's search mode (rjieba, the Rust port: the same cuts as
  pure-Python jieba, many times faster), which yields words and their sub-words.
- Latin runs are lowercased; identifiers are kept whole *and* split:
  ``processTransaction`` -> ``processtransaction process transaction``,
  ``retry_count`` -> ``retry_count retry count``, ``sg_pay_2024`` -> ``sg_pay_2024 sg pay 2024``.
- Stopwords (a short list of function words: library lists drop words like
  ``value`` or ``system`` that matter in code notes) and punctuation are dropped.

Weights: the document vector holds BM25's saturated, length-normalised term
frequency ``tf·(k1+1) / (tf + k1·(1-b+b·len/avg_len))``; the query vector holds 1 per
term; the store multiplies in IDF at query time (Qdrant's ``Modifier.Idf``, counted over
the asking user's points the index holds: ``rag.index.store``), so the IDF follows that
person's notes as they come and go, without re-weighting stored vectors, and nobody else's.
``avg_len`` is a setting (``bm25.avg_len``), not a statistic of the index: a chunk's vector
depends on its own text alone.
Term ids are the first 4 bytes of a BLAKE2b hash: stable across processes and runs.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from rag.config import Bm25Config

# CJK ideographs (+ kana/hangul) vs Latin/digit identifier runs. Anything else separates.
_LATIN_WORD = r"[A-Za-z0-9_]+(?:[.\-'][A-Za-z0-9_]+)*"
WORD_RUNS = re.compile(
    r"(?P<cjk>[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+)"
    rf"|(?P<word>{_LATIN_WORD})"
)
LATIN_WORDS = re.compile(_LATIN_WORD)  # WORD_RUNS's words alone
CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")  # WORD_RUNS's cjk
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_MARKDOWN_LINK = re.compile(r"\[([^\]\n]*)\]\((?:[^()\s]|\([^()\s]*\))*\)")
_URL = re.compile(r"https?://\S+")

MAX_TERM_CHARS = 40

STOPWORDS = frozenset(
    """
    的 了 和 与 及 或 是 在 就 都 而 也 被 把 让 给 对 从 向 于 以 之 其 这 那 这个 那个 这些 那些
    这样 那样 一个 一种 一些 有 没有 会 能 可以 要 将 还 又 再 并 并且 而且 但 但是 然后 所以 因为
    如果 那么 虽然 就是 还是 或者 以及 通过 进行 使用 用 我 我们 你 你们 他 他们 它 它们 她
    自己 什么 怎么 怎样 如何 为什么 哪 哪些 吗 呢 吧 啊 呀 嘛 么 着 过 得 地 个 等 等等 中 上 下
    a an the and or but if then else of to in on at by for with from as into than that this these
    those is are was were be been being it its do does did done has have had not no so such can
    could will would should may might must shall i you he she we they me my your our their them
    what which who whom whose when where why how there here also just very
    """.split()
)


@dataclass(frozen=True)
class SparseVector:
    indices: list[int]
    values: list[float]

    def __len__(self) -> int:
        return len(self.indices)


def _cjk_terms(run: str) -> list[str]:
    return [t for t in jieba().cut_for_search(run) if t.strip()]


@lru_cache(maxsize=1)
def jieba():
    """rjieba, imported when the first CJK text is cut (loading its dictionary takes ~0.15 s:
    a process that never tokenizes, such as the command line talking to a daemon, skips it)."""
    import rjieba

    return rjieba


def warm() -> None:
    """Load the CJK tokenizer now (``serve`` does, before it says it is ready): the first
    question does not pay for it."""
    jieba()


def frequency(word: str) -> int:
    """How common a Chinese word is: its count in jieba's dictionary (1 and up; a word the
    dictionary lacks gets the count its pieces suggest)."""
    return jieba().suggest_freq(word)


def _word_terms(word: str) -> list[str]:
    lower = word.lower()
    terms = [lower]
    parts = [p for chunk in re.split(r"[_.\-']+", word) for p in _CAMEL.findall(chunk)]
    if len(parts) > 1:
        terms.extend(p.lower() for p in parts)
    return terms


def search_text(text: str) -> str:
    """What of a chunk is worth matching: link text without its URL, no bare URLs."""
    text = _MARKDOWN_LINK.sub(r"\1", text)
    return _URL.sub(" ", text)


def tokenize(text: str) -> list[str]:
    """Terms of a text, in order, with duplicates (term frequency matters)."""
    terms: list[str] = []
    for m in WORD_RUNS.finditer(text):
        if m.lastgroup == "cjk":
            terms.extend(_cjk_terms(m.group()))
        else:
            terms.extend(_word_terms(m.group()))
    return [t for t in terms if t not in STOPWORDS and len(t) <= MAX_TERM_CHARS]


@lru_cache(maxsize=200_000)
def term_id(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "little")


def _vector(weights: dict[int, float]) -> SparseVector:
    indices = sorted(weights)
    return SparseVector(indices, [weights[i] for i in indices])


def document_vector(text: str, cfg: Bm25Config | None = None) -> SparseVector:
    """BM25 document side: saturated, length-normalised term frequencies."""
    cfg = cfg or Bm25Config()
    terms = tokenize(text)
    if not terms:
        return SparseVector([], [])
    norm = cfg.k1 * (1 - cfg.b + cfg.b * len(terms) / cfg.avg_len)
    weights: dict[int, float] = {}
    for term, tf in Counter(terms).items():
        tid = term_id(term)
        # Two terms hashing alike (rare at 2^32) simply add up.
        weights[tid] = weights.get(tid, 0.0) + tf * (cfg.k1 + 1) / (tf + norm)
    return _vector(weights)


def query_vector(text: str, also: Iterable[str] = ()) -> SparseVector:
    """BM25 query side: each distinct term once; IDF comes from the store. ``also``: more terms
    to look for as the text's own (an English question's Chinese words, ``rag.index.translate``)."""
    return _vector({term_id(t): 1.0 for t in set(tokenize(text)).union(also)})


def norm(name: str) -> str:
    """The key a name is known by (an entity's, in the memory): NFKC, case folded, inner
    spaces collapsed."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())
