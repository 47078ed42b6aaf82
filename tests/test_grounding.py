"""Reading an LLM's answer (rag.answer.grounding: refusals; rag.answer.support: what it stands on)
and the names a question uses (rag.answer.confidence), on replies real Qwen2.5-Coder 1.5B and 0.5B
models gave to dev questions."""

from __future__ import annotations

import pytest

from rag.answer.confidence import as_written, names, unknown_names
from rag.answer.grounding import refuses
from rag.answer.support import check

REFUSAL = "我笔记里没有相关内容"
BLOCKS = {
    1: ("[1] 提拉米苏的做法 (菜谱 › 甜品)", "马斯卡彭奶酪和蛋黄打发，手指饼干蘸咖啡液，一层饼干一层奶酪糊，冷藏 4 小时。"),
    2: ("[2] 重试策略 (工作)", "付款失败后第一次重试前等待 30 秒，之后每次翻倍，最多重试 5 次。"),
}


@pytest.mark.parametrize("text", [
    REFUSAL, "我们笔记里没有相关内容。", "笔记中没有提到具体的冷藏时间。", "抱歉，提供的片段中没有相关信息。",
    "根据提供的笔记，无法回答这个问题。", "The notes do not mention how long to chill it.",
    "Sorry, I cannot find that in your notes.",
])
def test_refusals_are_recognised_by_meaning(text):
    assert refuses(text, REFUSAL)


@pytest.mark.parametrize("text", [
    "冷藏 4 小时[1]。", "第一次重试前等待 30 秒[2]，没有提到上限以外的规则。", "It is chilled for 4 hours [1].",
])
def test_answers_are_not_refusals(text):
    assert not refuses(text, REFUSAL)


@pytest.mark.parametrize("text", ["", "[1]", "[1] [2][3]", " 【2】 "])
def test_a_reply_of_markers_only_is_no_refusal_and_says_nothing(text):
    # what the 1.5B wrote to three answerable dev questions: it pointed at blocks, it did not decline
    assert not refuses(text, REFUSAL)
    assert not check(text, "付款失败后多久重试？", BLOCKS).saying


def test_markers_count_in_sentences_that_say_something():
    c = check("要冷藏 4 小时[1]。", "提拉米苏要冷藏多久？", BLOCKS)
    assert [v.kind for v in c.saying] == ["supported"] and c.cited == [1] and c.saying[0].marked == [1]


def test_pasted_headers_and_the_question_back_cite_nothing():
    c = check("[1] 提拉米苏的做法 (菜谱 › 甜品)\n提拉米苏要冷藏多久？[1][2]", "提拉米苏要冷藏多久？", BLOCKS)
    assert not c.saying and c.cited == []


def test_markers_after_the_sentence_end_belong_to_it():
    c = check("第一次重试前等待 30 秒，之后每次翻倍。[2]", "付款失败后多久重试？", BLOCKS)
    assert c.saying[0].marked == [2] and c.cited == [2]


def test_a_sentence_following_a_block_gets_its_citation_inferred_before_its_end():
    c = check("第一次重试前等待 30 秒，之后每次翻倍，最多重试 5 次。", "付款失败后多久重试？", BLOCKS)
    assert c.saying[0].marked == [] and c.cited == [2]
    assert c.text == "第一次重试前等待 30 秒，之后每次翻倍，最多重试 5 次[2]。"


def test_a_close_paraphrase_of_a_block_is_cited():
    # the 1.5B's reply to A014, shortened: it says what the block says in its own order
    blocks = {1: ("[1] RocketMQ 存储 (中间件)", "RocketMQ 没有用 sendfile 直接转发文件，它的消息读写主要走 mmap，"
                  "因为 mmap 适合小块数据的随机读写。"),
              2: ("[2] Kafka (中间件)", "Kafka 发送消息时用 sendfile 零拷贝。")}
    c = check("阿里开源的 RocketMQ 不用直接转发文件的方式，因为它主要走 mmap。", "RocketMQ 为什么不用零拷贝转发文件？", blocks)
    assert c.cited == [1]


def test_a_short_answer_is_cited_when_a_block_holds_its_name():
    blocks = {1: ("[1] 机器人定位 (算法)", "在地上铺一串黑白方块组成的 De Bruijn 序列，机器人读最近几块就知道位置。"),
              2: ("[2] 序列化 (编程)", "Protocol Buffers 把消息序列化成字节。")}
    question = "只在地上铺一长串两种颜色的小方块，机器人就能知道自己走了多远——这利用的是哪种序列？"
    assert check("De Bruijn 序列", question, blocks).cited == [1]
    assert check("格雷码", question, blocks).cited == []  # a name no block holds


def test_the_replys_own_code_is_cited_only_when_copied():
    blocks = {1: ("[1] Go 的错误 (编程)", "返回一个值为 nil 的 *MyErr 时，接口本身不为 nil：一些操作之前先判断具体类型。"),
              2: ("[2] 重试策略 (工作)", "付款失败后第一次重试前等待 30 秒。")}
    question = "自定义错误类型返回后判断是不是空，为什么永远不为空？"
    made_up = "例如：\n```javascript\nfunction f() {\n  // 执行一些操作\n  return new Error('x');\n}\n```"
    assert check(made_up, question, blocks).cited == []
    copied = "```\n返回一个值为 nil 的 *MyErr 时，接口本身不为 nil\n```"
    c = check(copied, question, blocks)
    assert c.cited == [1] and c.text == copied  # cited, and the code is shown as the model wrote it


def test_an_answer_from_elsewhere_gets_no_citation():
    c = check("WireGuard 的握手过程是基于 Noise 协议模式设计的。", "WireGuard 握手怎么做？", BLOCKS)
    assert c.saying and c.cited == [] and c.text == ""


@pytest.mark.parametrize("question, expected", [
    ("用 firewall-cmd 永久开放 8080/tcp 端口的命令怎么写？", ["firewall-cmd", "tcp"]),
    ("Gradle 项目里的 gradle-wrapper.properties 文件是用来定义什么的？", ["gradle", "gradle-wrapper.properties"]),
    ("How does Apache Flink use watermarks to handle out-of-order events?", ["apache", "flink"]),
    ("What does the JVM flag -XX:+ShowCodeDetailsInExceptionMessages do?", ["jvm", "xx", "showcodedetailsinexceptionmessages"]),
    ("Is there a top-like tool that shows disk I/O per process on Linux?", ["linux"]),
    ("What reasons did the author himself give?", []),
    ("佛跳墙需要提前泡发哪些干货？", []),  # CJK words are not judged
    ("How is retry_count used with log4j?", ["retry_count", "log4j"]),
])
def test_names_a_question_uses(question, expected):
    assert names(question) == expected


def test_unknown_names_are_those_no_chunk_holds_nor_a_found_chunk_spells():
    held = {"nginx"}
    found = ["PostgreSQL 连接池配置"]
    assert unknown_names("nginx 和 postgres 以及 Caddy 怎么配？", held.__contains__, found) == ["caddy"]
    assert as_written("nginx 和 postgres 以及 Caddy 怎么配？", "caddy") == "Caddy"


@pytest.mark.parametrize("text", ["加了它也不能确定完全不锁表：MyISAM 表仍可能变化[1]。",
                                  "You cannot answer a ping with iptables dropping it [2]."])
def test_saying_something_cannot_be_done_is_no_refusal(text):
    assert not refuses(text, REFUSAL)


def test_a_name_the_best_chunks_found_write_in_chinese_counts_as_mentioned():
    chinese = {"atomic": frozenset({"原子"}), "habits": frozenset({"习惯", "习"}), "deep": frozenset({"深"}),
               "hunan": frozenset({"湖南"})}
    translate = lambda w: chinese.get(w, frozenset())  # noqa: E731
    found = ["原子习惯\n两分钟规则\n想读书，就先读一页。", "米粉鸭\n湖南的家常菜"]
    assert unknown_names("Atomic Habits 里的两分钟规则？", set().__contains__, found, translate) == []
    assert unknown_names("What is in the Hunan duck?", set().__contains__, found, translate) == []
    # a word the found chunks do not hold as a term (习 is inside 学习, not a word of it); a name no
    # chunk writes in any script; and a chunk further down than the best the LLM would read
    assert unknown_names("Habits 怎么养成？", set().__contains__, ["学习方法"], lambda w: frozenset({"习"})) == ["habits"]
    assert unknown_names("What do Deep Habits say?", set().__contains__, found, translate) == ["deep"]
    assert unknown_names("What is in the Hunan duck?", set().__contains__, found, translate, best=1) == ["hunan"]


def test_a_possessive_or_an_acronyms_plural_is_no_part_of_a_name():
    assert names("Why did Sentinel's warm-up and SPDY’s header compression differ from Alibaba's?") == [
        "sentinel", "spdy", "alibaba"]
    assert names("Why could older JDKs max out the CPU, and do APIs say why?") == ["jdk", "cpu", "api"]
