"""The Discord bot as ``serve`` runs it (``service``) and ``doctor`` checks it (``check``),
and ``build``, which puts its slash commands (synced to the configured guilds at start-up, or
globally), its message menu and its buttons on it."""

from __future__ import annotations

import asyncio
from typing import Iterator

import discord
from discord import app_commands

from rag.config import secret
from rag.errors import ConfigError
from rag.redact import redact_in_logs, safe_url

from bot.chat.checks import CHECK_TIMEOUT, CheckResult, nobody_mapped, token_or_problem
from bot.chat.texts import help_for
from bot.discord import answering, buttons, capturing, commands, media
from bot.discord.bot import DiscordBot, quiet_voice_warnings
from bot.session import doors

SAVE_MENU = "Save to Leanote"
FOLDER_SAVE_MENU = "Save to my notes"  # the same where captures go into the notes folder


def save_menu(parts) -> str:
    """The message menu's name: where it saves to."""
    return FOLDER_SAVE_MENU if doors.capture_target(parts) == "folder" else SAVE_MENU


def discord_help(parts) -> str:
    """``/help`` in Discord: it has no "reply /save", a message is saved from its menu (Apps →
    Save to Leanote), where capture is offered."""
    text = help_for(parts)
    if "\n/save" not in text:
        return text
    return "\n".join(line for line in text.splitlines() if not line.startswith("/save")) + (
        f"\n右键一条消息 → Apps → {save_menu(parts)}：把它存成笔记 / right-click a message → Apps → {save_menu(parts)} "
        f"to save it")


def build(host) -> DiscordBot:
    """The bot for ``host``, with its commands (the capture ones only where the host can write
    to Leanote) and its buttons."""
    bot = DiscordBot(host)
    _register(bot)
    bot.dynamic = (buttons.Pressed,)
    return bot


def _register(bot: DiscordBot) -> None:
    @bot.tree.error  # every command's, the capture ones or not
    async def on_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
        await bot.failed(interaction, getattr(error, "original", error))

    async def before(interaction: discord.Interaction) -> bool:  # a note begun with ✍️: written or ended
        return await commands.before_command(bot, interaction)

    bot.tree.interaction_check = before

    @bot.client.event
    async def on_app_command_completion(interaction: discord.Interaction, command) -> None:
        await commands.after_command(bot, interaction)

    @bot.tree.command(name="ask", description="向你的笔记提问 / ask your notes")
    @app_commands.describe(question="问题 / the question",
                           private="只有你能看到回答（默认是）/ only you see the answer (the default)",
                           file="语音或图片（可选）：问它说的或图里写的 / a voice clip or an image (optional): "
                                "ask what it says")
    async def ask(interaction: discord.Interaction, question: str = "", private: bool | None = None,
                  file: discord.Attachment | None = None) -> None:
        if file is not None:
            await media.ask(bot, interaction, question, file, private)
        else:
            await answering.ask(bot, interaction, question, private)

    @bot.tree.command(name="search", description="搜索笔记 / search your notes")
    @app_commands.describe(query="要找的词或问题 / words or a question to look for")
    async def search_(interaction: discord.Interaction, query: str) -> None:
        await commands.search(bot, interaction, query)

    @bot.tree.command(name="reset", description="重新开始对话 / forget this conversation")
    async def reset(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "reset")

    @bot.tree.command(name="status", description="同步状态 / sync status")
    async def status(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "status")

    @bot.tree.command(name="sync", description="立即同步（管理员）/ sync now (admins)")
    async def sync(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "sync")

    @bot.tree.command(name="why", description="上一个回答的依据 / why the last answer")
    async def why(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "why")

    @bot.tree.command(name="web", description="在浏览器里聊天 / chat in a browser (a one-time link, to you alone)")
    async def web(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "web")

    @bot.tree.command(name="about", description="记忆里关于它的事实和笔记 / what the memory knows about a name")
    @app_commands.describe(name="一个项目、术语或标签 / a project, a term or a tag, as your notes write it")
    async def about(interaction: discord.Interaction, name: str) -> None:
        await commands.memory(bot, interaction, "about", name)

    @bot.tree.command(name="related", description="相关笔记 / notes related to a note or a question")
    @app_commands.describe(target="笔记 id 或问题 / a note id, or a question")
    async def related(interaction: discord.Interaction, target: str) -> None:
        await commands.memory(bot, interaction, "related", target)

    @bot.tree.command(name="reject", description="删掉一条错的事实或相关 / reject a wrong fact or pair")
    @app_commands.describe(id="/about 或 /related 显示的 id / the f… or p… id /about and /related show")
    async def reject(interaction: discord.Interaction, id: str) -> None:
        await commands.run(bot, interaction, "verdict", id, "rejected")

    @bot.tree.command(name="confirm", description="确认一条事实或相关 / confirm a fact or pair")
    @app_commands.describe(id="/about 或 /related 显示的 id / the f… or p… id /about and /related show")
    async def confirm(interaction: discord.Interaction, id: str) -> None:
        await commands.run(bot, interaction, "verdict", id, "confirmed")

    @bot.tree.command(name="gaps", description="笔记还答不上来的问题 / what your notes could not answer")
    async def gaps_(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "gaps")

    @bot.tree.command(name="forget", description="忘掉你的知识空白、摘要设置和问答 / forget your gaps, digest and kept questions")
    async def forget(interaction: discord.Interaction) -> None:
        await commands.run(bot, interaction, "forget")

    @bot.tree.command(name="digest", description="笔记摘要 / a digest of your notes, in a direct message")
    @app_commands.describe(when="weekly mon 09:00 | daily 08:30 | off（可加时区 a time zone may follow）")
    async def digest_(interaction: discord.Interaction, when: str | None = None) -> None:
        await commands.digest(bot, interaction, when)

    @bot.tree.command(name="help", description="帮助 / help")
    async def help_(interaction: discord.Interaction) -> None:
        await bot.say(interaction, discord_help(bot.parts))

    if bot.parts is None or not doors.capture_offered(bot.parts):  # nowhere to write: no capture commands
        return

    @bot.tree.command(name="note", description="记一条笔记（收件箱）/ capture a note into your inbox")
    @app_commands.describe(text="内容，#标签 会成为标签 / the text; #hashtags become tags",
                           file="附件（可选）/ a file to attach (optional)")
    async def note(interaction: discord.Interaction, text: str, file: discord.Attachment | None = None) -> None:
        await capturing.note(bot, interaction, text, file)

    @bot.tree.command(name="append", description="追加到上一条记录 / add to your last capture")
    @app_commands.describe(text="要追加的内容 / the text to add")
    async def append(interaction: discord.Interaction, text: str) -> None:
        await capturing.add_text(bot, interaction, "append", text)

    @bot.tree.command(name="remember", description="记住一件事 / a dated line in your memory note")
    @app_commands.describe(text="要记住的事 / what to remember")
    async def remember(interaction: discord.Interaction, text: str) -> None:
        await capturing.add_text(bot, interaction, "remember", text)

    @bot.tree.command(name="outbox", description="还没写进 Leanote 的记录 / captures waiting for Leanote")
    async def outbox(interaction: discord.Interaction) -> None:
        await capturing.outbox(bot, interaction)

    async def save_message(interaction: discord.Interaction, message: discord.Message) -> None:
        await capturing.save_message(bot, interaction, message)

    bot.tree.add_command(app_commands.ContextMenu(name=save_menu(bot.parts), callback=save_message,
                                                   type=discord.AppCommandType.message))


async def service(host) -> None:
    """``leanote-rag serve`` runs this when ``discord.enabled``."""
    if not host.settings.discord.enabled:
        return
    token_env = host.settings.discord.token_env
    token = secret(token_env, "discord.token_env")
    redact_in_logs(token)
    bot = build(host)
    # (once logged in: a direct message can go) a capture's receipt a kill cut off, a gap a note
    # answers now, a digest; an /ask file: response a stop or a crash cut off: said so
    bot.after_login += [lambda: _tell_with(bot), lambda: media.interrupted(bot)]
    try:
        await bot.run(token)
    except discord.LoginFailure:
        raise ConfigError(f"Discord refused the token in {token_env}: copy the bot's token from the Discord "
                          f"developer portal there, then restart") from None
    finally:
        doors.stop_telling(host.parts, "discord", bot.tell)


async def _tell_with(bot: DiscordBot) -> None:
    doors.tell_with(bot.parts, "discord", bot.tell)


service.label = "Discord bot"


def check(settings) -> Iterator[CheckResult]:
    """``doctor``: the token is set and Discord accepts it (a login, no gateway); someone may ask."""
    cfg = settings.discord
    if not cfg.enabled:
        return
    name = "discord bot"
    token, problem = token_or_problem(cfg.token_env, "discord.token_env", name)
    if problem:
        yield problem
        return
    discord.http.Route.BASE = cfg.api_base.rstrip("/")

    quiet_voice_warnings()

    async def login():
        # the intents the bot runs with (none privileged: it reads only what interactions carry);
        # with none at all discord.py warns that the guilds intent seems disabled
        client = discord.Client(intents=discord.Intents.default())
        try:
            await client.login(token)
            return client.user
        finally:
            await client.close()

    try:
        me = asyncio.run(asyncio.wait_for(login(), CHECK_TIMEOUT))
    except discord.LoginFailure:
        yield name, False, f"Discord refused the token in {cfg.token_env}", \
            f"copy the bot's token from the Discord developer portal into {cfg.token_env}"
        return
    except (discord.HTTPException, OSError, asyncio.TimeoutError) as err:
        yield name, False, f"cannot reach Discord at {safe_url(cfg.api_base)}: {type(err).__name__}", \
            "check the network, or discord.api_base"
        return
    where = f"guilds {', '.join(map(str, cfg.guild_ids))}" if cfg.guild_ids else "every guild it is in"
    answers = "public" if cfg.public_answers else "private (only the asker sees them)"
    yield name, True, f"logged in as {me}; commands in {where}; answers {answers}", ""
    yield from nobody_mapped(settings, "discord")
