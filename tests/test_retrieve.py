import pytest

from rag.config import RetrievalConfig
from rag.errors import UserError
from rag.index.retrieve import cap_per_note, dbsf, fuse, normalise_query, rrf
from rag.index.points import Ranked


def ranked(*pairs):
    return [Ranked(id=i, score=1.0 / (n + 1), note_id=note) for n, (i, note) in enumerate(pairs)]


def test_rrf_scores_are_sums_of_reciprocal_ranks():
    dense = ranked(("a", "n1"), ("b", "n2"), ("c", "n3"))
    sparse = ranked(("c", "n3"), ("a", "n1"))
    fused = rrf({"dense": dense, "sparse": sparse}, k=60)
    scores = {f.id: f.score for f in fused}
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert [f.id for f in fused] == ["a", "c", "b"]
    assert fused[0].ranks == {"dense": 1, "sparse": 2}


def test_rrf_weights_favour_a_retriever():
    dense = ranked(("a", "n1"), ("b", "n2"))
    sparse = ranked(("b", "n2"), ("a", "n1"))
    assert rrf({"dense": dense, "sparse": sparse}, k=60, weights={"dense": 1.0, "sparse": 2.0})[0].id == "b"
    assert rrf({"dense": dense, "sparse": sparse}, k=60, weights={"dense": 2.0, "sparse": 1.0})[0].id == "a"


def test_rrf_with_one_retriever_keeps_its_order():
    only = ranked(("x", "n1"), ("y", "n2"), ("z", "n3"))
    assert [f.id for f in rrf({"sparse": only})] == ["x", "y", "z"]


def test_cap_per_note_keeps_rank_order_and_limit():
    fused = rrf({"dense": ranked(("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("a4", "A"), ("c1", "C"))})
    assert [f.id for f in cap_per_note(fused, per_note=2, limit=10)] == ["a1", "a2", "b1", "c1"]
    assert [f.id for f in cap_per_note(fused, per_note=1, limit=2)] == ["a1", "b1"]


def test_query_is_trimmed_and_capped():
    cfg = RetrievalConfig(max_query_chars=50)
    assert normalise_query("  线程池\n\n参数  ", cfg) == "线程池 参数"
    assert len(normalise_query("长" * 10_000, cfg)) == 50
    with pytest.raises(UserError, match="empty"):
        normalise_query(" \t\n", cfg)


def test_dbsf_normalises_each_retriever_then_weights():
    dense = [Ranked("a", 0.9, "n1"), Ranked("b", 0.8, "n2"), Ranked("c", 0.7, "n3")]
    sparse = [Ranked("c", 30.0, "n3"), Ranked("b", 10.0, "n2")]
    fused = {f.id: f for f in dbsf({"dense": dense, "sparse": sparse}, {"dense": 0.3, "sparse": 0.7})}
    # dense: mean 0.8, sd 0.0816 -> a maps to (0.9 - 0.555) / 0.49 = 0.704
    assert fused["a"].score == pytest.approx(0.3 * (0.9 - (0.8 - 3 * 0.08165)) / (6 * 0.08165), rel=1e-3)
    assert fused["c"].score > fused["b"].score > fused["a"].score  # the strong sparse match wins
    assert fused["c"].ranks == {"dense": 3, "sparse": 1} and fused["c"].scores["sparse"] == 30.0


def test_dbsf_follows_score_gaps_where_rrf_sees_only_ranks():
    filler_d = [Ranked(f"d{i}", 0.2, f"x{i}") for i in range(10)]
    filler_s = [Ranked(f"s{i}", 1.0, f"y{i}") for i in range(10)]
    w = {"dense": 0.5, "sparse": 0.5}
    # a wins dense by a hair, b wins sparse by a mile -> b
    dense = [Ranked("a", 0.61, "A"), Ranked("b", 0.60, "B")] + filler_d
    sparse = [Ranked("b", 40.0, "B"), Ranked("a", 2.0, "A")] + filler_s
    assert dbsf({"dense": dense, "sparse": sparse}, w)[0].id == "b"
    # a wins dense by a mile, b wins sparse by a hair -> a
    dense = [Ranked("a", 0.95, "A"), Ranked("b", 0.21, "B")] + filler_d
    sparse = [Ranked("b", 2.1, "B"), Ranked("a", 2.0, "A")] + filler_s
    assert dbsf({"dense": dense, "sparse": sparse}, w)[0].id == "a"
    # rank fusion cannot tell the two cases apart: a tie, broken the same way both times
    r = rrf({"dense": dense, "sparse": sparse}, 60, w)
    assert r[0].score == pytest.approx(r[1].score)


def test_dbsf_single_candidate_counts_as_best():
    fused = dbsf({"sparse": [Ranked("a", 3.0, "n1")]}, {"sparse": 0.7})
    assert fused[0].score == pytest.approx(0.7)


def test_latin_dense_share_leans_an_english_question_on_the_embedding():
    """Without the translation (``translate_english: false``), asked in English about Chinese
    notes, BM25 matches a chance word or two: with ``latin_dense_share`` set, the note the
    embedding places first does not lose to a weak BM25 match. A question with CJK characters
    keeps the configured weights, and so its order; unset, every question keeps them."""
    filler_d = [Ranked(f"d{i}", 0.45 - i * 0.02, f"D{i}") for i in range(20)]
    filler_s = [Ranked(f"s{i}", 2.0 - i * 0.09, f"S{i}") for i in range(20)]
    dense = [Ranked("congee", 0.62, "congee"), Ranked("water", 0.30, "water")] + filler_d
    sparse = [Ranked("water", 3.0, "water"), Ranked("congee", 1.5, "congee")] + filler_s
    rankings = {"dense": dense, "sparse": sparse}
    leaning = RetrievalConfig(translate_english=False, latin_dense_share=0.5)
    assert fuse(rankings, leaning, "How much rice and water for century egg congee?")[0].id == "congee"
    assert fuse(rankings, leaning, "皮蛋瘦肉粥要放多少大米和水？")[0].id == "water"  # the configured weights
    assert fuse(rankings, leaning)[0].id == "water"
    default = RetrievalConfig()  # the share unset: the configured weights for both
    assert fuse(rankings, default, "How much rice and water for century egg congee?")[0].id == "water"


def test_fuse_picks_the_configured_method():
    dense = ranked(("a", "n1"), ("b", "n2"))
    sparse = ranked(("b", "n2"), ("a", "n1"))
    as_rrf = fuse({"dense": dense, "sparse": sparse}, RetrievalConfig(fusion="rrf", dense_weight=1, sparse_weight=1))
    assert as_rrf[0].score == pytest.approx(1 / 61 + 1 / 62)
    as_dbsf = fuse({"dense": dense, "sparse": sparse}, RetrievalConfig())
    assert as_dbsf[0].score != as_rrf[0].score
