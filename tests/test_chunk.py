import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.index.chunk import chunk_text, size
from rag.config import ChunkingConfig

CFG = ChunkingConfig()


def para(seed: str, n: int) -> str:
    """A Chinese paragraph of n sentences of ~30 characters."""
    return "".join(f"{seed}第{i}句说明了一个关于系统设计与数据处理的重要细节内容。" for i in range(n))


def assert_ranges(text, chunks):
    for c in chunks:
        assert text[c.char_start : c.char_end] == c.text
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(a.char_start <= b.char_start for a, b in zip(chunks, chunks[1:]))


def test_size_counts_cjk_as_one_and_latin_by_thirds():
    assert size("中文字符") == 4
    assert size("abc def") == 2
    assert size("中 ab c") == 2


def test_heading_paths_follow_the_outline():
    text = (
        "# Redis\n\n" + para("概述", 8) + "\n\n## 持久化\n\n### RDB\n\n" + para("快照", 8)
        + "\n\n### AOF\n\n" + para("日志", 8) + "\n\n## 集群\n\n" + para("分片", 8) + "\n"
    )
    chunks = chunk_text(text, CFG)
    assert_ranges(text, chunks)
    paths = [c.heading_path for c in chunks]
    assert ("Redis",) in paths
    assert ("Redis", "持久化", "RDB") in paths
    assert ("Redis", "持久化", "AOF") in paths
    assert ("Redis", "集群") in paths
    rdb = next(c for c in chunks if c.heading_path == ("Redis", "持久化", "RDB"))
    assert "快照第0句" in rdb.text and "日志" not in rdb.text
    assert rdb.heading == "Redis › 持久化 › RDB"


def test_hash_lines_inside_code_are_not_headings():
    text = "# 脚本\n\n说明文字。\n\n```bash\n# install\npip install x\n## not a heading\n```\n"
    chunks = chunk_text(text, CFG)
    assert len(chunks) == 1
    assert chunks[0].heading_path == ("脚本",)
    assert "## not a heading" in chunks[0].text


def test_long_section_is_cut_into_bounded_chunks_with_sentence_overlap():
    text = "## 长段落\n\n" + para("长", 80) + "\n"
    chunks = chunk_text(text, CFG)
    assert_ranges(text, chunks)
    assert len(chunks) >= 4
    for c in chunks:
        assert size(c.text) <= CFG.max_size
    for c in chunks[:-1]:
        assert size(c.text) >= CFG.min_size
    overlaps = [a.char_end - b.char_start for a, b in zip(chunks, chunks[1:])]
    assert all(o > 0 for o in overlaps)
    for a, b in zip(chunks, chunks[1:]):
        shared = text[b.char_start : a.char_end]
        assert shared.endswith("。")  # cut on a sentence boundary
        assert 0.05 * CFG.max_size <= size(shared) <= 0.25 * CFG.max_size


def test_tiny_sections_merge_with_a_neighbour():
    text = "# 笔记\n\n## A\n\n短。\n\n## B\n\n也短。\n\n## C\n\n还是很短。\n"
    chunks = chunk_text(text, CFG)
    assert len(chunks) == 1
    assert "短。" in chunks[0].text and "还是很短。" in chunks[0].text
    assert chunks[0].heading_path == ("笔记",)  # the common part of the merged paths


def test_a_code_block_is_never_cut_below_the_hard_cap():
    code = "```java\n" + "".join(f"    int value{i} = compute(value{i - 1});\n" for i in range(80)) + "```\n"
    assert CFG.max_size < size(code) < CFG.code_hard_cap
    text = "## 代码\n\n" + para("前", 10) + "\n\n" + code + "\n" + para("后", 10) + "\n"
    chunks = chunk_text(text, CFG)
    assert_ranges(text, chunks)
    holders = [c for c in chunks if "int value0" in c.text]
    assert len(holders) == 1 and code in holders[0].text


def test_a_giant_code_block_is_cut_between_lines():
    code = "```python\n" + "".join(f"result_{i} = process_transaction(order_{i}, retry_count={i})\n" for i in range(400)) + "```\n"
    assert size(code) > CFG.code_hard_cap
    chunks = chunk_text("# 大段代码\n\n" + code, CFG)
    pieces = [c for c in chunks if "process_transaction" in c.text]
    assert len(pieces) > 2
    for c in pieces[:-1]:
        assert c.text.endswith("\n")  # cut after a whole line
    joined = "".join(re.findall(r"result_\d+ = [^\n]+\n", "".join(c.text for c in pieces)))
    assert joined.count("result_399 =") == 1 and joined.count("result_0 =") == 1


def test_a_100kb_line_without_punctuation_is_cut():
    line = "数据" * 50_000
    chunks = chunk_text(line, CFG)
    assert_ranges(line, chunks)
    assert len(chunks) > 100
    assert all(size(c.text) <= CFG.max_size for c in chunks)
    assert "".join(c.text for c in chunks).count("数据") >= 50_000  # nothing lost


def test_empty_and_whitespace_give_no_chunks():
    assert chunk_text("", CFG) == []
    assert chunk_text("  \n\n\t\n", CFG) == []


def test_heading_only_note_gives_no_chunks_but_heading_then_text_does():
    assert chunk_text("# 只有标题\n", CFG) == []
    chunks = chunk_text("# 标题\n\n一句话。\n", CFG)
    assert len(chunks) == 1 and chunks[0].heading_path == ("标题",)


def test_emoji_and_zero_width_text_chunks_safely():
    text = "# 😀 表情\n\n" + "🙂\u200d好的\u200b。" * 300
    chunks = chunk_text(text, CFG)
    assert_ranges(text, chunks)
    assert chunks[0].heading_path == ("😀 表情",)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(min_size=0, max_size=300),
            st.sampled_from(["# 标题\n", "## 小节\n", "```\n", "```python\ncode\n```\n", "\n\n", "- 列表\n", "| a | b |\n|---|---|\n"]),
            st.text(alphabet="中文字符。！？，abc XYZ_\n", min_size=0, max_size=2000),
        ),
        max_size=12,
    )
)
def test_any_text_chunks_into_exact_slices(parts):
    text = "".join(parts)
    chunks = chunk_text(text, CFG)
    assert_ranges(text, chunks)
    for c in chunks:
        assert c.text.strip()
        assert size(c.text) <= CFG.code_hard_cap + CFG.min_size


@pytest.mark.parametrize("max_size", [300, 600, 1000])
def test_configured_sizes_are_respected(max_size):
    cfg = ChunkingConfig(min_size=max_size // 3, max_size=max_size, code_hard_cap=max(1800, max_size))
    text = "\n\n".join(f"## 第{i}节\n\n" + para(str(i), 15) for i in range(6))
    chunks = chunk_text(text, cfg)
    assert all(size(c.text) <= max_size for c in chunks)
