import pytest

from rag.index.clean import clean, html_to_markdown, strip_front_matter

from conftest import EXAMPLES


def test_markdown_front_matter_is_removed():
    text = "---\ntitle: 笔记\ntags: [a, b]\ncreated: 2024-03-02\n---\n\n# 标题\n\n正文"
    assert clean(text, True) == "# 标题\n\n正文\n"


def test_a_leading_rule_that_is_not_metadata_stays():
    text = "---\n这只是一条分隔线下面的文字\n---\n正文"
    assert strip_front_matter(text) == text


@pytest.mark.parametrize(
    "url, expected",
    [
        ("/api/file/getImage?fileId=5e182cf45af8585a222af02a", "[图片: 拓扑]"),
        ("http://leanote.example.com/api/file/getImage?fileId=5e182cf45af8585a222af02a", "[图片: 拓扑]"),
        ("/file/outputImage?fileId=5e182cf45af8585a222af02a", "[图片: 拓扑]"),
        ("leanote://file/getImage?fileId=5e182cf45af8585a222af02a", "[图片: 拓扑]"),
        ("https://img.example.com/a.png", "[图片: 拓扑]"),
    ],
)
def test_markdown_images_become_placeholders(url, expected):
    assert clean(f"看图：![拓扑]({url}) 完", True) == f"看图：{expected} 完\n"


@pytest.mark.parametrize(
    "url",
    [
        "/api/file/getAttach?fileId=6a1b2c3d4e5f6a7b8c9d0e1f",
        "https://note.example.com/api/file/getAttach?fileId=6a1b2c3d4e5f6a7b8c9d0e1f",
        "/attach/download?attachId=6a1b2c3d4e5f6a7b8c9d0e1f",
        "leanote://file/getAttach?fileId=6a1b2c3d4e5f6a7b8c9d0e1f",
    ],
)
def test_leanote_attachment_links_become_placeholders(url):
    assert clean(f"见 [报销单.pdf]({url})。", True) == "见 [附件: 报销单.pdf]。\n"


def test_bare_leanote_file_url_becomes_placeholder():
    assert clean("原图 /api/file/getImage?fileId=5e182cf45af8585a222af02a 在这", True) == "原图 [图片] 在这\n"


def test_markdown_code_blocks_stay_byte_for_byte():
    code = "```python\nurl = '/api/file/getImage?fileId=abc'  # ![x](y)\n\u00a0\u200b  x = 1   \n\n\n\n```\n"
    text = "# 代码\n\n  ![图](/api/file/getImage?fileId=1)\u200b  \n\n" + code + "\n    indented = '![i](/api/file/getImage?fileId=2)'\n"
    cleaned = clean(text, True)
    assert code in cleaned
    assert "    indented = '![i](/api/file/getImage?fileId=2)'" in cleaned
    assert "[图片: 图]" in cleaned
    assert "\u200b" not in cleaned.replace(code, "")


def test_zero_width_and_no_break_spaces_are_tidied_in_prose():
    assert clean("零\u200b宽\ufeff字符\u00a0和\u3000空格", True) == "零宽字符 和 空格\n"


def test_html_note_keeps_structure_and_drops_noise():
    html = """<div><h1>网络&nbsp;设置</h1>
<p data-mce-style="color:red" style="color:red">路由器&nbsp;在客厅。</p><p><br></p><p><br data-mce-bogus="1"></p>
<script>alert("x")</script><style>p{color:red}</style><iframe src="https://evil"></iframe>
<h2>地址</h2><ul><li>网关 192.168.50.1</li><li>DNS 223.5.5.5</li></ul>
<table border="1"><thead><tr><th>设备</th><th>IP</th></tr></thead><tbody><tr><td>NAS</td><td>192.168.50.10</td></tr></tbody></table>
<pre class="brush:bash;toolbar: false">ping -c 3 192.168.50.1 &amp;&amp; echo ok
while read h; do ssh "$h" uptime; done &lt; hosts.txt
  indented   spaces
</pre>
<p><img src="/api/file/getImage?fileId=5f1a2b3c4d5e6f7a8b9c0d1e" data-mce-src="/api/file/getImage?fileId=5f1a2b3c4d5e6f7a8b9c0d1e" alt="网络拓扑"></p>
</div>"""
    md = clean(html, False)
    assert md.startswith("# 网络 设置\n")
    assert "## 地址" in md
    assert "- 网关 192.168.50.1" in md
    assert "| NAS | 192.168.50.10 |" in md
    assert '```bash\nping -c 3 192.168.50.1 && echo ok\nwhile read h; do ssh "$h" uptime; done < hosts.txt\n  indented   spaces\n```' in md
    assert "[图片: 网络拓扑]" in md
    for noise in ("alert", "color:red", "evil", "data-mce", "&nbsp;", "\u00a0", "<br", "\n\n\n"):
        assert noise not in md


def test_html_code_language_from_a_code_class():
    md = html_to_markdown('<pre><code class="language-java">Map&lt;K,V&gt; m;\n</code></pre>')
    assert "```java\nMap<K,V> m;\n```" in md


def test_html_code_that_contains_fences_gets_a_longer_fence():
    md = html_to_markdown("<pre>```\ninside\n```</pre>")
    assert md.strip().startswith("````") and "```\ninside\n```" in md


def test_html_attachment_link_becomes_placeholder():
    md = clean('<p>附件：<a href="/api/file/getAttach?fileId=6a1b2c3d4e5f6a7b8c9d0e1f">发票.pdf</a></p>', False)
    assert md == "附件：[附件: 发票.pdf]\n"


@pytest.mark.parametrize(
    "content, is_markdown",
    [
        ("", True),
        ("", False),
        ("   \n\n  ", True),
        ("<p><br></p><p>&nbsp;</p>", False),
        ("<div><p>unclosed <b>bold <i>and <table><tr><td>cell", False),
        ("\x00\x01\x02\x1b[31m\x7f binary", True),
        ("🙂😀 emoji 表情 \u200d\u200c", True),
        ("<p>" + "长" * 100_000 + "</p>", False),
    ],
)
def test_bad_input_gives_text_or_nothing_never_an_error(content, is_markdown):
    out = clean(content, is_markdown)
    assert isinstance(out, str)
    assert "\x00" not in out and "\x1b" not in out


def test_broken_html_keeps_its_text():
    assert "cell" in clean("<div><p>unclosed <b>bold <table><tr><td>cell", False)


def test_image_only_html_note_is_a_placeholder():
    assert clean('<p><img src="/api/file/getImage?fileId=1" alt=""></p>', False) == "[图片]\n"


def test_sample_html_note_cleans_without_script_or_editor_attributes():
    html = (EXAMPLES / "运维" / "家庭网络与路由器设置.html").read_text(encoding="utf-8")
    md = clean(html, False)
    assert "192.168.50.100" in md
    for noise in ("<script", "__leanoteStat", "data-mce", "border-collapse"):
        assert noise not in md
