"""What the chat doors say when they do not do what was asked, and the words of their buttons: one
place for every door (``bot.session`` says them; ``bot.chat.texts`` and ``gaps`` take theirs from here). Plain text, bilingual; each door escapes and splits it for itself.

``REFUSALS``: a refusal's text by its reason code (``views.Reply.refused``); the ones that take
values are functions below. ``BUTTONS``: what each button under an answer, a list or a draft
says (``views.Button``); ``PRESSED``: the replies to a press that did what it was asked."""

from __future__ import annotations

DOOR_NAMES = {"telegram": "Telegram", "discord": "Discord", "api": "API"}

REFUSALS = {
    # who may use it
    "unresolved": "你的账号对应的 Leanote 用户还没同步过，请稍后再试。 / Your Leanote account has not been synced yet; "
                  "try again later.",
    "many_users": "这个令牌可以查多个 Leanote 用户的笔记：请说明查哪一个。 / This token may ask several Leanote users' "
                  "notes: say whose.",
    "not_allowed": "你没有权限。 / Not allowed.",  # a stranger refused a short while ago, where silence is no answer
    # what was asked
    "empty": "请写下问题。 / Please write a question.",
    "empty_search": "请写下关键词。 / Please write what to search for.",
    "empty_name": "请写下名称或问题。 / Please write a name or a question.",
    "admins_only": "只有管理员可以 /sync。 / Only admins may /sync.",
    "no_capture": "这里不能写入 Leanote。 / Writing to Leanote is not available here.",
    "memory_off": "记忆功能没有打开（memory.enabled: false）。 / The memory of the notes is off (memory.enabled: false "
                  "in the config).",
    "memory_not_yet": "还没有笔记的记忆：等笔记同步完再试。 / There is no memory of the notes yet: try again after the "
                      "notes have synced.",
    # a press on a button
    "not_yours": "这是别人的回答。 / This is someone else's answer.",
    "unknown_answer": "这个回答已经过期了，请再问一次。 / This answer has expired: ask again.",
    "remapped": "这个回答来自另一个 Leanote 账号的笔记，依据不再显示给你。 / This answer came from another Leanote "
                "account's notes: its trace is no longer shown to you.",
    "unknown_gap": "这不是你的问题。 / This is not one of your gaps.",
    "nothing_waits": "没有等着写的笔记（已写好、已取消或已过期）。 / No note is waiting to be written (written, cancelled "
                     "or expired).",
    "unknown_button": "这个按钮已经过期了。 / This button has expired.",
    "message_gone": "找不到那条消息了：请再发一次。 / That message is gone: please send it again.",
    "ask_again": "请再发一次这个问题。 / Please send the question again.",
}

# the replies to a press that did what it was asked
PRESSED = {
    "rated": "谢谢，会用它来改进回答。 / Thanks: this helps improve the answers.",
    "saving": "正在保存… / Saving…",
}

# (icon, words) of each button; a door shows them its own way (Telegram text, Discord an emoji and a label)
BUTTONS = {
    "up": ("👍", ""), "down": ("👎", ""), "why": ("", "Why? / 依据"), "save": ("", "Save as note / 存为笔记"),
    "confirmed": ("👍", "confirm"), "rejected": ("👎", "reject"),
    "w": ("✍️", "write"), "x": ("✖", "dismiss"), "c": ("✖", "取消 cancel"),
    "s": ("💾", "存为笔记 save as the note"), "a": ("❓", "回答它 answer it"),
    "nq": ("", "Save as note / 存为笔记"),
}


def stranger(platform: str, person: int | str) -> str:
    """The refusal for someone ``users:`` does not hold: their id on this door, to send the owner."""
    name = DOOR_NAMES.get(platform, platform)
    return (f"抱歉，你还没有权限使用这个机器人。你的 {name} id 是 {person}，请把它发给机器人的主人。\n"
            f"Sorry, you may not use this bot yet. Your {name} id is {person}: send it to the bot's owner.")


def slow_down(per_minute: int, wait: float) -> str:
    return (f"慢一点 🙂 每分钟最多 {per_minute} 个问题，{wait:.0f} 秒后再问吧。 / Easy there: {per_minute} questions a "
            f"minute; try again in {wait:.0f} s.")


def too_large(name: str, max_mb: float) -> str:
    """A file refused from the size its door says, before it is fetched."""
    return f"文件 {name} 太大：最多 {max_mb:g} MB，没有保存。 / {name} is too large: at most {max_mb:g} MB; nothing was saved."
