import pytest

from rag.config import Bm25Config
from rag.index.lexical import document_vector, query_vector, search_text, term_id, tokenize


@pytest.mark.parametrize(
    "text, expected",
    [
        ("processTransaction", ["processtransaction", "process", "transaction"]),
        ("retry_count", ["retry_count", "retry", "count"]),
        ("sg_pay_2024", ["sg_pay_2024", "sg", "pay", "2024"]),
        ("HTTPServerError", ["httpservererror", "http", "server", "error"]),
        ("JSON", ["json"]),
    ],
)
def test_identifiers_are_kept_whole_and_split(text, expected):
    assert tokenize(text) == expected


def test_chinese_uses_jieba_search_mode_with_sub_words():
    terms = tokenize("中华人民共和国的数据库连接池")
    assert "中华人民共和国" in terms
    assert "中华" in terms and "共和国" in terms  # search mode adds the parts
    assert "连接" in terms or "连接池" in terms
    assert "的" not in terms


def test_mixed_text_lowercases_latin_and_drops_stopwords_and_punctuation():
    terms = tokenize("Redis 的 RDB 和 AOF：the persistence, is it on?")
    assert terms == ["redis", "rdb", "aof", "persistence"]


def test_search_text_drops_urls_but_keeps_link_text():
    assert search_text("见 [官方文档](https://redis.io/docs/x) 与 https://example.com/a?b=c 完") == "见 官方文档 与   完"


def test_term_ids_are_stable_across_runs():
    # Fixed values: changing the hash would silently corrupt every existing index.
    assert term_id("redis") == 1098873762
    assert term_id("线程池") == 3138640795
    assert term_id("redis") != term_id("Redis".lower() + " ")


def test_bm25_document_weights_saturate_and_normalise_length():
    cfg = Bm25Config(k1=1.2, b=0.75, avg_len=10)
    one = document_vector("redis", cfg)
    three = document_vector("redis redis redis", cfg)
    ten = document_vector(" ".join(["redis"] * 10), cfg)
    w = lambda v: dict(zip(v.indices, v.values))[term_id("redis")]
    assert w(one) < w(three) < w(ten) < cfg.k1 + 1  # more is better, but bounded
    short = document_vector("redis cache", cfg)
    long = document_vector("redis cache " + " ".join(f"word{i}" for i in range(40)), cfg)
    assert w(short) > w(long)  # the same tf counts less in a longer chunk


def test_query_vector_is_unit_weights_of_distinct_terms():
    v = query_vector("redis redis 集群")
    assert sorted(v.indices) == sorted({term_id("redis"), term_id("集群")})
    assert v.values == [1.0, 1.0]
    assert len(query_vector("的 the ，。")) == 0


def test_vectors_have_sorted_unique_indices():
    v = document_vector("processTransaction retry_count 线程池 参数 线程池")
    assert v.indices == sorted(set(v.indices))
    assert len(v.indices) == len(v.values)
