"""A question asked in a conversation, made searchable on its own, without making the person
wait for it.

In a chat every question after the first is asked in a conversation. Sending the whole
history (up to ``answer.history_chars``) to the LLM to rewrite each one would put an LLM call
before the search that grows with the history: on a small CPU a person's later questions would
show their sources ever later, and each answer's evidence be cut for the time spent
(docs/answers.md, "Sources first on Telegram"). So:

1. **Only a follow-up is rewritten.** A question stands on its own unless it is very short
   (``为什么？``, ``And Redis?``) or short and refers back (``那它保留多少份？``, ``what about
   its config?``, or starts by carrying on: ``And what water temperature?``). A long question that happens to hold a 那 (``线程池那几个大小参数…``) stands
   alone.
2. **A small prompt.** The rewrite reads the conversation's last questions (in their
   standalone form) and the start of the last answer: what names the topic, not the whole
   history.
3. **Within a share of the budget.** At the measured speed the rewrite must fit
   ``REWRITE_SHARE`` of ``answer.first_token_budget``, and it is given no longer than that.
   When it would not fit, or does not come in time, the follow-up is searched joined to the
   last question (``家里服务器怎么备份的？ 那它保留多少份？``), which names the topic too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag.speed import Speed

CONDENSE = """Rewrite the user's last message as one standalone question that can be understood without the conversation.
Keep the language of the last message. Output only the question."""

REWRITE_SHARE = 0.25  # of the first-token budget, at most, for the rewrite
MIN_REWRITE_WAIT = 1.0  # seconds: however fast the model measured, it gets this long
REWRITE_TOKENS = 40  # a standalone question, written
TURNS = 2  # earlier questions the rewrite reads
ANSWER_HEAD = 300  # characters of the last answer it reads
JOIN_CHARS = 200  # characters of the last question a follow-up is joined to

VERY_SHORT = 6  # size (below) at or under which a question is a follow-up whatever it says (为什么？)
SHORT = 20  # size at or under which a question that refers back is a follow-up (那它保留多少份？)

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+#-]*")
# Words that point back at something said before: pronouns, demonstratives, "the other / also".
_REFERS_ZH = re.compile(r"它|他们|她们|这|那|其|该|此|上面|上述|前面|刚才|刚刚|之前|还有|另外|另一|同样|也|呢")
_REFERS_EN = re.compile(
    r"\b(it|its|they|them|their|this|that|these|those|same|above|else|also|too|instead|what about|how about)\b"
    r"|^\W*(and|but|or|so|then)\b",  # a question that starts by carrying on: "And what water temperature?"
    re.I)


def size(question: str) -> int:
    """How much a question says: a CJK character counts one, a Latin word two (about as much
    as a two-character Chinese word)."""
    return len(_CJK.findall(question)) + 2 * len(_WORD.findall(question))


def is_follow_up(question: str) -> bool:
    """Whether the question may need the conversation to be understood (see the module)."""
    n = size(question)
    if n <= VERY_SHORT:
        return True
    return n <= SHORT and bool(_REFERS_ZH.search(question) or _REFERS_EN.search(question))


def messages(history: list[tuple[str, str]], question: str) -> list[dict]:
    """The rewrite's prompt: the last TURNS questions, the head of the last answer, the question."""
    turns = history[-TURNS:]
    lines = [f"Q: {q}" for q, _ in turns[:-1]]
    last_q, last_a = turns[-1]
    head = " ".join(last_a.split())
    if len(head) > ANSWER_HEAD:
        head = head[:ANSWER_HEAD].rstrip() + " …"
    lines += [f"Q: {last_q}", f"A: {head}"]
    return [
        {"role": "system", "content": CONDENSE},
        {"role": "user", "content": "Conversation:\n" + "\n".join(lines) + f"\n\nLast message: {question}"},
    ]


def joined(history: list[tuple[str, str]], question: str) -> str:
    """The follow-up searched without the LLM: the last question, then this one. The last
    question may itself be joined (a chain of follow-ups): its start, which names the topic,
    is kept, so the chain does not grow with every follow-up."""
    last = history[-1][0]
    if len(last) > JOIN_CHARS:
        last = last[:JOIN_CHARS].rstrip()
    return f"{last} {question}"


@dataclass
class Plan:
    """Whether to rewrite with the LLM, for how long at most, and why (for the trace)."""

    rewrite: bool
    wait: float = 0.0
    why: str = ""


def plan(prompt: list[dict], speed: Speed, budget: float) -> Plan:
    """How the follow-up is made standalone within ``REWRITE_SHARE`` of ``budget`` at ``speed``."""
    share = budget * REWRITE_SHARE
    needs = speed.reply_seconds("\n".join(m["content"] for m in prompt), REWRITE_TOKENS)
    if needs is None:
        return Plan(True, max(MIN_REWRITE_WAIT, share), "the LLM's speed is not measured yet")
    if needs > share:
        return Plan(False, 0.0, f"a rewrite would take ~{needs:.0f} s here, over {REWRITE_SHARE:.0%} "
                                f"of answer.first_token_budget")
    return Plan(True, min(share, max(MIN_REWRITE_WAIT, needs * 2)), f"~{needs:.1f} s here")
