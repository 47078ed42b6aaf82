"""What the chat bots say to a message that asks nothing (``bot.usecases.unasked``): a reminder,
a to-do, an alarm, said or typed. Plain text, bilingual; each platform adds its button."""

from __future__ import annotations

def not_a_question(can_save: bool, ask_anyway: str) -> str:
    """The reply: it is not answered, and why; what can be done with it (``can_save``: the
    button under it saves it as a note); ``ask_anyway``: how to ask it all the same (a typed
    /ask is never taken for a reminder)."""
    zh = "这不是一个问题（像是提醒或待办），我只回答关于你笔记的问题，也不会定提醒。"
    en = "That isn't a question (it reads like a reminder or a to-do): I answer questions about your notes and set no reminders."
    if can_save:
        zh += "要把它存成笔记吗？"
        en += " Save it as a note?"
    else:
        zh += "这里不能存笔记（没有设置记录的去处）。"
        en += " Notes cannot be saved here (capture is not set up)."
    return f"{zh}\n{en}\n{ask_anyway}"


ASK_ANYWAY_TELEGRAM = "要当问题问：/ask 加上这句话。 / To ask it anyway: /ask followed by the words."
ASK_ANYWAY_DISCORD = "要当问题问：把这句话打在 /ask 里。 / To ask it anyway: type the words in /ask."
