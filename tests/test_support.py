"""What of an LLM's answer stands on its evidence (rag.answer.support): unit by unit, on
replies a real Qwen2.5-Coder 1.5B wrote to dev questions (tests/data/real_replies.jsonl, with
the evidence it read) and on the cases the answer issue named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag.answer.support import Checker, Gate, check, names, numbers, split, verdict

REAL = {r["id"]: r for r in map(json.loads, (Path(__file__).parent / "data" / "real_replies.jsonl")
                                .read_text(encoding="utf-8").splitlines()) if r}
REFUSAL = "我笔记里没有相关内容"
CONGEE = {1: ("[1] 皮蛋瘦肉粥 (菜谱 › 粥)", "材料：大米 150ml，饮用水 1 升，皮蛋 2 颗，瘦肉 100 克。大米提前泡 30 分钟。"),
          2: ("[2] 备份 (运维)", "crontab 里每天 03:17 运行 backup.sh：17 3 * * * /opt/backup.sh，保留 7 份。")}


def real(key: str):
    r = REAL[key]
    return r["reply"], r["question"], {int(n): tuple(b) for n, b in r["blocks"].items()}


def streamed(reply: str, question: str, blocks, pieces: int = 7) -> tuple[str, str]:
    """The reply fed to a Gate in pieces of ``pieces`` characters: what passed, and the whole check's text."""
    gate = Gate(Checker(question, blocks))
    out = "".join(gate.feed(reply[i:i + pieces]) for i in range(0, len(reply), pieces)) + gate.flush()
    return out, gate.result.text


def test_a_fully_supported_real_answer_is_shown_as_written_with_its_citation():
    reply, question, blocks = real("A005")
    c = check(reply, question, blocks)
    assert [v.kind for v in c.saying] == ["supported", "supported"] and c.cited == [1]
    assert verdict(reply, c, REFUSAL) == "inferred"
    # the words are the model's, only the marker is added, before each sentence's end
    assert c.text == reply.replace("无限循环。", "无限循环[1]。").replace("100%。", "100%[1]。")
    assert streamed(reply, question, blocks) == (c.text, c.text)


@pytest.mark.parametrize("reply, invented", [
    ("1碗大米和2碗水 [1]", ["1碗", "2碗"]),  # the note: 大米 150ml, 饮用水 1 升
    ("皮蛋要放 3 颗[1]。", ["3 颗"]),  # the note: 2 颗
    ("每天凌晨 2 点运行备份脚本 [2]。", ["2 点"]),  # the note: 03:17
    ("maxmemory 设的是 10GB，淘汰策略是 LRU[1]。", ["10GB", "maxmemory", "lru"]),
])
def test_a_cited_sentence_with_a_number_or_name_no_evidence_holds_is_not_shown(reply, invented):
    c = check(reply, "皮蛋瘦肉粥要放多少大米和水？皮蛋几颗？备份什么时候跑？", CONGEE)
    assert [v.kind for v in c.saying] == ["unsupported"]
    assert sorted(c.saying[0].invented) == sorted(invented)
    assert c.text.strip() == ""


def test_the_same_numbers_in_other_words_stand():
    c = check("放两颗皮蛋，大米 150 毫升[1]。备份在每天 3:17 跑，保留 7 份[2]。", "皮蛋瘦肉粥怎么做？备份什么时候跑？", CONGEE)
    assert [v.kind for v in c.saying] == ["supported", "supported"] and c.cited == [1, 2]


def test_a_number_stands_only_in_its_own_sentence_and_aside():
    """The soaking time is not the pressure cooker's 20 minutes beside it (a real 1.5B reply)."""
    note = {1: ("[1] 印度鹰嘴豆咖喱", "干鹰嘴豆需提前浸泡至少 8 小时（来不及可用高压锅压 20 分钟）。\n"
                                    "1. 取出速冻汤圆，放入碗中。\n2. 倒入开水。\n3. 微波炉高火 4 分钟。")}
    c = check("豆子要提前浸泡20分钟[1]。豆子要提前浸泡至少 8 小时[1]。要高火转4分钟[1]。", "豆子要提前泡多久？", note)
    assert [v.kind for v in c.verdicts] == ["unsupported", "supported", "supported"]
    assert c.invented_specifics == ["20分钟"]


def test_dates_are_one_number_however_written():
    assert ("2038-1-19", "date", "2038年1月19日") in numbers("最多到2038年1月19日")
    blocks = {1: ("[1] TIMESTAMP", "范围是 1970-01-01 00:00:01 ～ 2038-01-19 03:14:07")}
    assert check("TIMESTAMP 最多存到 2038年1月19日[1]。", "能存到哪一年？", blocks).saying[0].kind == "supported"


def test_the_question_echoed_back_says_nothing():
    # the 1.5B's reply on a busy machine; the note says 6 or 10 minutes
    reply = "根据 [1] 段落，溏心蛋关火后要静置几分钟。"
    c = check(reply, "溏心蛋关火后要静置几分钟？", {1: ("[1] 溏心蛋", "水开后关火，盖盖静置 6 分钟是溏心，10 分钟全熟。")})
    assert c.saying == [] and verdict(reply, c, REFUSAL) == "nothing"
    # the prompt's own words back: the 1.5B's whole reply to A032 in one dev run
    reply = "依据的片段编号：[1]"
    c = check(reply, "鸭蛋黄为什么一定要挖掉？", {1: ("[1] 麻婆豆腐", "去除蛋黄（一定要去除，不然会腥）")})
    assert c.saying == [] and verdict(reply, c, REFUSAL) == "nothing"


def test_an_answer_mostly_the_models_own_is_partly_supported_and_its_invented_step_dropped():
    reply, question, blocks = real("A017")  # Raft: the note's PreVote, the model's own "mechanisms"
    c = check(reply, question, blocks)
    assert verdict(reply, c, REFUSAL) == "partly" and c.share < 0.5
    assert any("2 倍" in v.invented for v in c.dropped)
    assert "2 倍" not in c.text


def test_a_refusal_is_a_refusal():
    c = check("我笔记里没有相关内容。", "猫什么时候打疫苗？", CONGEE)
    assert verdict("我笔记里没有相关内容。", c, REFUSAL) == "refused"


def test_a_marker_moves_to_the_block_that_holds_the_sentence_and_several_blocks_together_count():
    c = check("大米提前泡 30 分钟[2]。", "粥怎么做？", CONGEE)
    assert c.text == "大米提前泡 30 分钟[1]。"
    c = check("大米 150ml 泡 30 分钟，备份保留 7 份[1][2]。", "粥和备份？", CONGEE)
    assert c.saying[0].kind == "supported" and c.saying[0].blocks == [1, 2]


def test_code_stands_when_it_is_the_notes_and_is_dropped_whole_when_made_up():
    blocks = {1: ("[1] 备份", "```\n17 3 * * * /opt/backup.sh\n```\n每天 03:17 跑。")}
    ok = "用 crontab：\n```\n17 3 * * * /opt/backup.sh\n```\n"
    c = check(ok, "备份怎么定时？", blocks)
    assert [v.kind for v in c.verdicts if v.code] == ["supported"] and "17 3 * * *" in c.text
    made_up = "用 systemd timer：\n```ini\n[Timer]\nOnCalendar=*-*-* 02:00:00\nPersistent=true\n```\n"
    c = check(made_up, "备份怎么定时？", blocks)
    assert [v.kind for v in c.verdicts if v.code] == ["unsupported"] and "OnCalendar" not in c.text


def test_the_gate_passes_each_unit_once_it_is_complete_and_checked():
    reply = "大米 150ml，饮用水 1 升[1]。另外加 1碗水。皮蛋 2 颗[1]。"
    out, whole = streamed(reply, "皮蛋瘦肉粥要放多少大米和水？", CONGEE, pieces=3)
    assert out == whole == "大米 150ml，饮用水 1 升[1]。皮蛋 2 颗[1]。"
    gate = Gate(Checker("粥？", CONGEE))
    assert gate.feed("大米 150ml。[") == ""  # a marker being written belongs to the sentence before it
    assert gate.feed("1]皮蛋") == "大米 150ml。[1]"


def test_a_line_ending_in_a_colon_stands_or_falls_with_what_it_introduces():
    question = "皮蛋瘦肉粥怎么做？"
    shown_ = "我的做法如下：\n\n大米 150ml，饮用水 1 升[1]。"
    out, whole = streamed(shown_, question, CONGEE, pieces=4)
    assert out == whole == shown_
    lure = "先确认账号：\n\n[点这里登录](https://phish.example/login)。"
    c = check(lure, question, CONGEE)
    assert c.text.strip() == "" and [v.text for v in c.dropped] == ["先确认账号：\n", "[点这里登录](https://phish.example/login)。"]
    assert streamed(lure, question, CONGEE, pieces=3)[0].strip() == ""
    assert check("做法如下：", question, CONGEE).dropped  # nothing after it: it introduced nothing


def test_units_give_the_reply_back_and_keep_list_items_and_code_whole():
    reply = "步骤：\n1. 泡米[1]。再煮。\n- 加皮蛋\n```python\nx = 1\n```\n完。"
    units = split(reply)
    assert "".join(u.text for u in units) == reply
    assert [u.text for u in units] == ["步骤：\n", "1. 泡米[1]。", "再煮。\n", "- 加皮蛋\n", "```python\nx = 1\n```\n", "完。"]
    assert units[4].code


def test_names_and_numbers_a_text_states():
    assert names("用 Hippo4j 或 setCorePoolSize()，配置在 /etc/app.conf，加 --force") == [
        "/etc/app.conf", "--force", "hippo4j", "setcorepoolsize", "etc/app.conf", "force"]
    assert names("The Redis author said skip lists are simpler.") == ["redis"]
    # a list line's first word is capitalised as a sentence's is: no name (the 1.5B's English lists)
    assert names("- Two threads put at once.\n- Different threads then lose a write in Redis.") == ["redis"]
    # list ordinals are no numbers; 一 and idioms are no count; 两 before a unit is
    assert numbers("1. 第一步\n十分重要，两颗，三分钟") == [("2", "颗", "两颗"), ("3", "min", "三分钟")]


# --- a number stands only in its role (the first-hour issue's cases, the notes' own text) -----------

GUILINGGAO = {1: ("[1] 龟苓膏的做法 (菜谱 › 龟苓膏)",
                  "用料：\n- 龟苓膏粉 25 克\n- 冷水 120 毫升\n- 开水 500 毫升\n- 白砂糖 100 克\n"
                  "1. 在锅中倒入龟苓膏粉 25 克与冷水 120 毫升，充分搅拌至无颗粒感。\n"
                  "2. 在另一个容器中加入白砂糖 100 克，倒入沸水 500 毫升，搅拌至糖完全溶解。")}
EXAM = {1: ("[1] 机器学习应用 —— Photo OCR (学习 › 机器学习)",
            "You estimate that you would have to pay each of the labellers ￥10 per hour, and that each labeller can "
            "label 4 examples per minute. About how much will it cost to hire labellers?\n\nA. ￥600\n\nB. ￥400\n\n"
            "C. ￥10,000\n\nD. ￥250\n\n解答：B")}
CAKES = {1: ("[1] 戚风蛋糕的做法 (菜谱 › 烘焙)", "蛋黄糊：蛋黄 4 个，玉米油 40 克，牛奶 50 克，低筋面粉 100 克，细砂糖 20 克。"),
         2: ("[2] 红豆沙的做法 (菜谱 › 甜品)", "红豆 200 克，冰糖 50 克，清水 1 升。")}
GLOSSARY = {"how much sugar and boiling water for guilinggao?": frozenset({"开水", "沸水", "糖", "糖类"}),
            "how much did i pay for the kitchen knife?": frozenset({"工资", "支付", "菜刀"}),
            "how much sugar goes into the red bean paste?": frozenset({"糖", "红豆", "豆沙"})}


def glossary(text: str) -> frozenset[str]:
    """The English words' Chinese (rag.index.translate's, for these questions)."""
    return GLOSSARY.get(text.lower().strip(), frozenset({"糖"} if "sugar" in text.lower() else ()))


@pytest.mark.parametrize("question", ["龟苓膏要放多少糖和开水？", "How much sugar and boiling water for guilinggao?"])
def test_a_bare_number_stands_only_where_the_note_uses_it_for_what_was_asked(question):
    """"how much sugar and boiling water" → "100 克[1] 120 毫升[1]": the 120 ml are the cold
    water's. The sugar's 100 g stands, the boiling water's number does not."""
    c = check("100 克[1]，120 毫升[1]。", question, GUILINGGAO, glossary)
    assert [(v.text.strip(" ，。"), v.kind) for v in c.saying] == [("100 克[1]", "supported"),
                                                                   ("120 毫升[1]", "unsupported")]
    assert "120 毫升" in c.verdicts[-1].invented or any("120" in x for v in c.verdicts for x in v.invented)
    right = check("100 克[1]，500 毫升[1]。", question, GUILINGGAO, glossary)
    assert [v.kind for v in right.saying] == ["supported", "supported"]


def test_a_number_from_an_exams_wrong_option_is_no_price_paid():
    c = check("￥600[1]", "How much did I pay for the kitchen knife?", EXAM, glossary)
    assert [v.kind for v in c.saying] == ["unsupported"] and c.cited == []


def test_a_bare_number_from_the_other_recipe_does_not_stand_for_an_english_question():
    """An English question cited the wrong recipe's number: the cake has 100 g of flour, the red
    bean paste 50 g of rock sugar. Placed by the question's Chinese words (糖), not waved through
    because the question is in English and the note in Chinese."""
    question = "How much sugar goes into the red bean paste?"
    assert [v.kind for v in check("100 克[1]", question, CAKES, glossary).saying] == ["unsupported"]
    right = check("50 克[2]", question, CAKES, glossary)
    assert [v.kind for v in right.saying] == ["supported"] and right.cited == [2]
    # the model's English words about a Chinese note are still not its evidence (as before)
    assert [v.kind for v in check("Use 100 g of sugar[1].", question, CAKES, glossary).saying] == ["unsupported"]


def test_a_headings_or_quoted_list_items_number_is_markup_not_a_claim():
    """The 1.5B copies a note's '### 4. 为什么…' and '> 1. 菜码切丝备用。': the number is the
    heading's or the item's, so it ends no sentence (no '### 4[1]. ' shown) and is no specific
    the evidence must hold."""
    blocks = {1: ("[1] HTTP/2 问答 (网络)", "为什么只有一个压缩/流控制上下文？最初的提议里有流分组的概念。"),
              2: ("[2] 炸酱面 (菜谱)", "菜码切丝备用。葱切碎。")}
    reply = "### 4. 为什么只有一个压缩/流控制上下文？\n\n> 1. 菜码切丝备用。\n"
    units = [u.text for u in split(reply) if u.text.strip()]
    assert units == ["### 4. 为什么只有一个压缩/流控制上下文？\n", "> 1. 菜码切丝备用。\n"]
    c = check(reply, "HTTP/2 为什么只有一个压缩上下文？炸酱面菜码怎么处理？", blocks)
    assert c.invented_specifics == [] and "4[" not in c.text and "1[" not in c.text
    assert [v.kind for v in c.saying] == ["supported", "supported"]


# --- a number keeps its role, a period its period, a row its row; a title is no answer (issue 52) ---------


def test_the_cold_waters_120_ml_is_not_the_boiling_waters_however_the_reply_is_cut():
    """"做龟苓膏时，白砂糖和开水各要放多少？" answered "100 克[1] 120 毫升[1]" was shown: the 120 ml
    are the cold water's (the note: 开水 500 毫升). Each claim the model closed with its marker is
    judged on its own, and no number places another."""
    question = "做龟苓膏时，白砂糖和开水各要放多少？"
    c = check("100 克[1] 120 毫升[1]", question, GUILINGGAO)
    assert [(v.text.strip(), v.kind) for v in c.saying] == [("100 克[1]", "supported"), ("120 毫升[1]", "unsupported")]
    assert c.invented_specifics == ["120 毫升"] and "120" not in c.text
    for reply in ("白砂糖 100 克，开水 120 毫升[1]。", "白砂糖100克，开水120毫升[1]。", "开水 120 毫升[1]。"):
        assert "120 毫升" not in check(reply, question, GUILINGGAO).text.replace("120毫升", "120 毫升"), reply
    for reply in ("100 克[1] 500 毫升[1]", "白砂糖 100 克，开水 500 毫升[1]。", "白砂糖100克，开水500毫升[1]。"):
        assert [v.kind for v in check(reply, question, GUILINGGAO).saying] == ["supported"] * (2 if "[1] " in reply else 1)


def test_a_list_lines_number_is_not_placed_by_the_line_under_it():
    """The note's "- 冷水 120 毫升" is followed by "- 开水 500 毫升": 开水 near the 120 ml in the text
    is on another line, another item."""
    note = {1: ("[1] 龟苓膏的做法 (菜谱 › 龟苓膏)", "用料：\n- 龟苓膏粉 25 克\n- 冷水 120 毫升\n- 开水 500 毫升\n- 白砂糖 100 克")}
    assert check("开水要 120 毫升[1]。", "开水放多少？", note).saying[0].kind == "unsupported"
    assert check("开水要 500 毫升[1]。", "开水放多少？", note).saying[0].kind == "supported"


def test_a_changed_period_is_not_the_notes():
    """"独库公路每天大约 6 月到 10 月开放" for a note's 每年: the numbers are the note's, the period is not."""
    note = {1: ("[1] 新疆自驾攻略 (旅行 › 独库公路)", "独库公路每年 6 月到 10 月开放，其余时间因积雪封路。全程 561 公里，建议两天走完。"),
            2: ("[2] 家里的备份 (运维)", "备份脚本每天凌晨 3 点跑。")}
    question = "独库公路什么时候开放？"
    c = check("独库公路每天大约 6 月到 10 月开放[1]。", question, note)
    assert [v.kind for v in c.saying] == ["unsupported"] and c.invented_specifics == ["每天"]
    assert check("独库公路每年大约 6 月到 10 月开放[1]。", question, note).saying[0].kind == "supported"
    assert check("独库公路一般 6 月到 10 月开放[1]。", question, note).saying[0].kind == "supported"
    # a period the note says where the unit's words are
    assert check("每天凌晨 3 点跑[2]。", "备份每天几点跑？", note).saying[0].kind == "supported"


TRIP = {1: ("[1] 新疆自驾行程与花费 (旅行 › 新疆)",
            "| 项目 | 说明 | 费用 |\n|---|---|---|\n| 机票 | 上海→乌鲁木齐 MU5643，7 月 12 日 08:05 起飞 | 1850 元 |\n"
            "| 租车 | 乌鲁木齐取车 7 天，丰田 RAV4 | 2100 元 |\n| 住宿 | 6 晚 | 1500 元 |")}


@pytest.mark.parametrize("reply, stands", [
    ("租车花了 1850 元[1]。", False),  # the flight's price
    ("1850 元[1]", False),
    ("租车 7 月 12 日 08:05 取车[1]。", False),  # the flight's date and time
    ("租车花了 2100 元[1]。", True),
    ("2100 元[1]", True),
    ("租车 7 天，丰田 RAV4[1]。", True),
])
def test_a_number_from_a_table_row_about_something_else_is_not_the_answer(reply, stands):
    """A car-hire answer put together from the flight's row: a row is one record; the rows above
    and below it are others."""
    c = check(reply, "新疆自驾租车花了多少钱？", TRIP)
    assert [v.kind for v in c.saying] == ["supported" if stands else "unsupported"], c.verdicts


def test_a_table_stands_whole_with_its_rows_citing_in_their_last_cell_and_a_lone_row_is_no_sentence():
    """The 1.5B's table of ext4's modes was shown as lines "| 模式 | 说明 |[1]" (a marker after a row's
    last pipe is no table any more), and "| 1:15 |[1]" was shown as an answer sentence."""
    reply = "各项花费：\n\n| 项目 | 费用 |\n|---|---|\n| 租车 | 2100 元 |\n| 机票 | 1850 元 |[1]\n\n一共很多。"
    c = check(reply, "新疆自驾各项花了多少钱？", TRIP)
    assert "| 租车 | 2100 元 [1] |\n| 机票 | 1850 元 [1] |" in c.text and "|[1]" not in c.text
    assert "| 项目 | 费用 |\n|---|---|\n" in c.text
    wrong = check("| 项目 | 费用 |\n|---|---|\n| 租车 | 1850 元 |\n", "新疆自驾租车花了多少钱？", TRIP)
    assert [v.kind for v in wrong.saying] == ["unsupported"] and wrong.text.strip() == ""
    lone = check("| 1:15 |[1]\n", "几点？", {1: ("[1] 时刻表", "| 班次 | 时间 |\n|---|---|\n| 早班 | 1:15 |")})
    assert lone.text.strip() == "" and lone.saying == [] and verdict("| 1:15 |[1]", lone, REFUSAL) == "nothing"
    # streamed, the table passes whole once it is complete
    out, whole = streamed(reply, "新疆自驾各项花了多少钱？", TRIP, pieces=5)
    assert out == whole == c.text


RECIPES = {1: ("[1] 可乐鸡翅的做法 (菜谱 › 荤菜)", "鸡翅 10 个，可乐 500 毫升。鸡翅两面划刀，冷水下锅焯水。"),
           2: ("[2] 红烧肉的做法 (菜谱 › 荤菜)", "五花肉 500 克切块，冰糖 30 克炒糖色。")}


@pytest.mark.parametrize("title", ["[2] 红烧肉的做法 (菜谱 / 荤菜)", "红烧肉的做法 (菜谱 / 荤菜)[2]", "**红烧肉的做法**[2]",
                                   "> 红烧肉的做法 [2]", "红烧肉的做法 (菜谱 › 荤菜) <note-0a1b2c3d4e5f>"])
def test_an_answer_that_is_only_a_notes_title_is_no_answer(title):
    """To a question no note answers the 1.5B wrote a source's header line and an invented
    sentence; the sentence was dropped and the title line shown, cited, as the answer."""
    question = "做佛跳墙要提前多久泡鲍鱼？"
    reply = f"{title}\n鲍鱼要提前泡 24 小时。"
    c = check(reply, question, RECIPES)
    assert [v.kind for v in c.saying] == ["unsupported"] and verdict(reply, c, REFUSAL) == "uncited"
    assert verdict(title, check(title, question, RECIPES), REFUSAL) == "nothing"
    # beside an answer it stays a line of no consequence; to "which note" it is the answer
    c = check(f"{title}\n五花肉 500 克切块[2]。", "红烧肉要多少五花肉？", RECIPES)
    assert verdict("x", c, REFUSAL) == "cited" and c.cited == [2]
    c = check("红烧肉的做法[2]。", "哪篇笔记写了冰糖炒糖色？", RECIPES)
    assert [v.kind for v in c.saying] == ["supported"] and c.cited == [2]


def test_an_english_answer_that_pastes_the_notes_chinese_is_bounded():
    """Asked in English, the 1.5B pasted the whole HashMap note's Chinese (every sentence of it
    stands on its block, so all of it was shown). The note's words are bounded (COPY_CHARS of
    the notes' script); its English sentence still passes; a Chinese question is not bounded."""
    from rag.answer import copies

    sentences = [f"第{i}步，把锅烧热，倒入{i}0 毫升油，再放葱姜蒜爆香，炒到葱段发黄、香味出来为止，这一步大约要一两分钟。"
                 for i in range(1, 16)]
    note = {1: ("[1] 红烧肉的做法 (菜谱 › 荤菜)", "".join(sentences))}
    reply = "".join(f"> {s}[1]\n" for s in sentences) + "\nHeat the wok first and fry the aromatics until fragrant[1].\n"
    question = "How do I start braised pork?"
    c = copies.check(reply, question, note, lambda t: frozenset({"锅", "葱", "姜", "蒜", "香"}))
    shown_zh = len(re.findall(r"[\u3400-\u9fff]", c.text))
    assert 0 < shown_zh <= copies.COPY_CHARS and sum(v.cut for v in c.verdicts) >= 8
    assert c.text.startswith("> 第1步") and "第15步" not in c.text
    assert verdict(reply, c, REFUSAL) == "cited" and c.cited == [1]
    # what streams is what the whole check shows
    bound = copies.Bound(Gate(Checker(question, note)), question)
    out = "".join(bound.feed(reply[i:i + 9]) for i in range(0, len(reply), 9)) + bound.flush()
    assert out == bound.result.text and "第15步" not in out
    # in Chinese, the note's words are the answer: nothing is cut
    zh = copies.check(reply, "红烧肉第一步怎么做？", note)
    assert "第15步" in zh.text and not any(v.cut for v in zh.verdicts)


EEL = {1: ("[1] 蒲烧茄子的做法 (菜谱 › 素菜)", "- 1 份蒲烧汁\n  - 20 ml 蜂蜜\n  - 15 ml 白糖\n  - 40 ml 生抽\n  - 10 ml 老抽\n  - 20 ml 料酒"),
       2: ("[2] 包菜炒鸡蛋粉丝的做法 (菜谱 › 素菜)", "* 盐 2 g、生抽 15 ml、老抽 10 ml、蚝油 10 ml\n* 包菜半颗，鸡蛋 2 个"),
       3: ("[3] 银耳莲子粥的做法 (菜谱 › 汤与粥)", "制作需经历浸泡和慢熬，全程大约需要 3.5 小时。")}


def test_a_sentences_numbers_are_its_own_notes_not_another_recipes():
    """The 1.5B, three dev runs out of three: "蒲烧汁要放 20 ml 蜂蜜、15 ml 生抽和 40 ml 老抽[1]" — the
    eel sauce's 15 ml is sugar and its 生抽 40 ml; another recipe's "生抽 15 ml" bore it out. Shown
    citing [1], every number must be [1]'s note's."""
    question = "蒲烧茄子的蒲烧汁要放多少毫升蜂蜜、生抽和老抽？"
    c = check("根据 [1] 片段，蒲烧汁要放 20 ml 蜂蜜、15 ml 生抽和 40 ml 老抽。", question, EEL)
    assert [v.kind for v in c.saying] == ["unsupported"] and "15 ml" in c.invented_specifics
    c = check("- 生抽：15 ml[1]\n", question, EEL)
    assert 1 not in c.cited, c.verdicts  # [2] says so of its own dish; [1] does not
    right = check("蒲烧汁要放 20 ml 蜂蜜、40 ml 生抽和 10 ml 老抽[1]。", question, EEL)
    assert [v.kind for v in right.saying] == ["supported"] and right.cited == [1]
    # a number from another dish's note, however well its words fit, for a dish no note has
    c = check("佛跳墙需要提前泡发干鹰嘴豆，一般要煨3.5小时。", "佛跳墙需要提前泡发哪些干货，一般要煨几个小时？",
              {**EEL, 4: ("[4] 鹰嘴豆炸饼的做法 (菜谱 › 主食)", "干鹰嘴豆 200g（提前浸泡 8 小时）")})
    assert [v.kind for v in c.saying] == ["unsupported"]


def test_a_number_after_a_colon_stays_with_what_it_is_said_of():
    """"干辣椒面：60 克\\n孜然粉：20 克" was cut at the colons: the names were echoes of the question
    (not shown) and "60 克[1]\\n20 克[1]" was the answer, bare."""
    note = {1: ("[1] 炸串酱料的做法 (菜谱 › 酱料)", "- 干辣椒面 60 克\n- 孜然粉 20 克\n- 食盐 20 克")}
    c = check("干辣椒面：60 克\n孜然粉：20 克\n", "炸串酱料里干辣椒面和孜然粉各放多少克？", note)
    assert c.text == "干辣椒面：60 克[1]\n孜然粉：20 克[1]\n"
    wrong = check("干辣椒面：20 克\n", "炸串酱料里干辣椒面和孜然粉各放多少克？", note)
    assert [v.kind for v in wrong.saying] == ["unsupported"]
    assert [u.text for u in split("原因：\n先炒糖色。")] == ["原因：\n", "先炒糖色。"]  # a colon before words still ends one
