"""Is a message a question at all? A voice memo "Remind me to call the dentist tomorrow" ran
the answer pipeline for 25 s and became a knowledge gap. ``not_a_question`` tells such a
message apart: a reminder, a to-do, an alarm or a note to self, said to the bot, that asks
the notes nothing.

The rule is narrow on purpose, since a real question refused costs more than a reminder
answered: a message is *not* a question only when it **starts** (after a greeting or a polite
"please" / "can you" / "请" / "帮我") with one of those requests, and what follows asks for
nothing:

- "remind me" / "提醒我" only with what a reminder goes on with: "to", "that", "about", a time
  ("tomorrow", "at 9", "明天", "下午三点"), or (Chinese) an errand's verb ("给", "去", "买",
  "打电话"…); "remind me what the Wi-Fi password is", "提醒我一下上次那个报错" ask;
- "don't forget" / "别忘了" / "不要忘记", "remember to" / "记得" (but "记得…吗" asks);
- "note to self", "to-do:", "reminder:", "备忘", "待办", "记一下", "记下";
- "set an alarm / a timer / a reminder", "wake me up", "定个闹钟", "叫我起床".

Whatever follows may not hold a question word ("how", "what", "why", "which", "where",
"who", "whether", "怎么", "什么", "为什么", "哪", "多少", "几点", "是否", "有没有"…), so
"remind me how backups work" and "提醒我一下备份怎么做" are questions. Imperatives that ask
("tell me", "explain", "告诉我", "说说") are never caught. Measured on the dev questions:
docs/answers.md ("A message that is not a question").
"""

from __future__ import annotations

import re

# Said before the request, and not part of it: a greeting, "please", "can you", "请", "帮我".
_LEAD_EN = (r"(?:(?:hey|hi|hello|ok|okay|so|um+|uh+|oh|and|also|please|pls|bot|notes?)\b[\s,.!:;-]*"
            r"|(?:can|could|would|will)\s+you\s+(?:please\s+)?|i\s+(?:want|need|would\s+like)\s+you\s+to\s+)*")
_LEAD_ZH = r"(?:(?:嘿|喂|嗯|那个|好的|好|请|麻烦你?|帮我|帮忙|你能|你可以|你|能不能|可不可以|可以)[\s,，.。!！:：、]*)*"

_TIME_EN = (r"(?:to|that|about|at|in|on|tomorrow|tonight|today|later|next|this|every|each|before|after|once|"
            r"first\s+thing|\d)")
_TIME_ZH = (r"(?:明天|后天|今天|今晚|晚上|早上|上午|下午|中午|傍晚|凌晨|周[一二三四五六日天末]|星期|礼拜|下周|下星期|下个?月|"
            r"每天|每周|每晚|每月|[0-9一二三四五六七八九十两]+\s*(?:点|号|分钟|小时|天后)|一会儿?|待会儿?|等会儿?|过会儿?|到时候|"
            r"回家|下班|出门|睡前|饭后)")
_ERRAND_ZH = (r"(?:给|去|要|该|把|带|买|打电话|打给|交|还|吃|喝|做|取|拿|寄|预约|续费|缴|付|洗|收|关|开|发|回复|联系|约|"
              r"记得|别忘)")

_REQUESTS = [
    # (pattern of the request at the start, what must follow it for a reminder: None, anything)
    (re.compile(rf"^{_LEAD_EN}remind\s+me\b[\s,]*", re.I), re.compile(rf"^{_TIME_EN}\b", re.I)),
    (re.compile(rf"^{_LEAD_ZH}提醒(?:我|一下)*[\s,，:：]*"), re.compile(rf"^(?:{_TIME_ZH}|{_ERRAND_ZH})")),
    (re.compile(rf"^{_LEAD_EN}(?:don'?t|do\s+not|never)\s+(?:let\s+me\s+)?forget\b", re.I), None),
    (re.compile(rf"^{_LEAD_EN}remember\s+to\b", re.I), None),
    (re.compile(rf"^{_LEAD_EN}(?:note\s+to\s+self|to-?\s?do|reminder|memo)\b\s*[:：,-]", re.I), None),
    (re.compile(rf"^{_LEAD_EN}(?:set|make|add|create)\s+(?:an?\s+|the\s+|my\s+)?(?:alarm|timer|reminder)\b", re.I),
     None),
    (re.compile(rf"^{_LEAD_EN}wake\s+me\b", re.I), None),
    (re.compile(rf"^{_LEAD_ZH}(?:别|不要|千万别)忘(?:了|记)?"), None),
    (re.compile(rf"^{_LEAD_ZH}记得"), None),
    (re.compile(rf"^{_LEAD_ZH}(?:备忘|待办|记一下|记下|记个事)[\s:：,，]*"), None),
    (re.compile(rf"^{_LEAD_ZH}(?:定|设|设置|订|帮我定)(?:一?个)?(?:闹钟|提醒|定时器?)"), None),
    (re.compile(rf"^{_LEAD_ZH}(?:叫我起床|明早叫我|明天早上叫我)"), None),
]

_ASKS_EN = re.compile(r"\b(?:how|what|what's|whats|where|where's|which|who|whom|whose|why|whether)\b", re.I)
_ASKS_EN_START = re.compile(r"^[\s,:;-]*(?:when|if|is|are|does|do|did|can|could|should)\b", re.I)
_ASKS_ZH = re.compile(r"什么|啥|怎么|怎样|咋|如何|哪|为什么|为何|多少|多久|多长|几[点个号次天岁年分时种]|谁|是否|有没有|是不是"
                      r"|能不能|可不可以|要不要|对不对|行不行")
_ENDS_ASKING = re.compile(r"(?:吗|么|呢)\s*[?？。.!！]*\s*$|[?？]\s*$")


def not_a_question(text: str) -> str | None:
    """The request ``text`` makes instead of a question ("reminder"), or None: it is (or may
    be) a question, to be answered."""
    words = " ".join((text or "").split())
    if not words or len(words) > 300:  # a long message is not a reminder said in passing
        return None
    for request, follows in _REQUESTS:
        m = request.match(words)
        if m is None:
            continue
        rest = words[m.end():]
        if _ASKS_EN.search(rest) or _ASKS_EN_START.match(rest) or _ASKS_ZH.search(rest):
            return None  # "remind me how …", "提醒我一下备份怎么做": a question
        if follows is not None and not follows.match(rest):
            return None  # "remind me the Wi-Fi password", "提醒我一下上次那个报错": asks
        if "记得" in m.group(0) and _ENDS_ASKING.search(rest):
            return None  # "记得我上次写的 nginx 配置吗": "do you remember …?"
        return "reminder"
    return None
