"""A real memory of two Leanote users for the bots' memory tests: the fake Leanote holds
Alice's and Bob's notes, one real sync pass indexes them (chunks, entities, related pairs),
and the LLM tier's facts are stored as it stores them (``store_llm``), without the LLM."""

from __future__ import annotations

from types import SimpleNamespace

from rag.memory.store import MemoryStore

from conftest import make_settings, run_pass

ALICE = "5dbed2987db161bc2a85b919"
BOB = "5f38858837b4dcd92cefeb84"
A_BOOK, B_BOOK = "5e16ca22f6ffdbad5b4ba501", "5e16ca22f6ffdbad5b4ba502"
PASSWORDS = {"LR_PW_ALICE": "alice-pw", "LR_PW_BOB": "bob-pw"}

A_ATLAS, A_POOL, A_BACKUP, A_EGGS = ("6%023x" % i for i in (1, 2, 3, 4))
B_ATLAS, B_TUNE = ("6%023x" % i for i in (11, 12))

NOTES = [
    (ALICE, A_BOOK, A_ATLAS, "Atlas 数据库迁移", ["Atlas", "PostgreSQL"],
     "# Atlas 数据库迁移\n\n把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL。连接池用 pgbouncer，"
     "迁移脚本放在 `migrate_atlas.py`。迁移前先用 pg_dump 做一次全量备份。"),
    (ALICE, A_BOOK, A_POOL, "PostgreSQL 连接池配置", ["PostgreSQL", "pgbouncer"],
     "# PostgreSQL 连接池\n\npgbouncer 用 transaction 模式，pool_size 设为 20。Atlas 的服务通过 pgbouncer "
     "连接 PostgreSQL，max_client_conn 是 500。"),
    (ALICE, A_BOOK, A_BACKUP, "PostgreSQL 备份", ["PostgreSQL"],
     "# PostgreSQL 备份\n\n每天凌晨用 pg_dump 备份 PostgreSQL 数据库，保留 14 天。Atlas 的数据库也在里面，"
     "恢复时用 pg_restore。"),
    (ALICE, A_BOOK, A_EGGS, "番茄炒蛋", ["菜谱"],
     "# 番茄炒蛋\n\n先把鸡蛋炒好盛出，再下番茄，最后加一小勺糖压酸味。"),
    (BOB, B_BOOK, B_ATLAS, "Bob 的 Atlas 机房笔记", ["Atlas", "PostgreSQL"],
     "# Atlas 部署\n\nBob 的项目 Atlas 用 PostgreSQL，服务器在机房 B3，密码在 BOB-ONLY-99。"),
    (BOB, B_BOOK, B_TUNE, "Bob 的 PostgreSQL 调优", ["PostgreSQL"],
     "# PostgreSQL 调优\n\nshared_buffers 设为内存的四分之一，Atlas 的 PostgreSQL 在机房 B3。BOB-TUNE-77"),
]

# (subject, predicate, object, quote) per note, as the LLM tier would store them
FACTS = {
    A_ATLAS: [("Atlas", "uses database", "PostgreSQL", "把项目 Atlas 的数据库从 MySQL 换成了 PostgreSQL"),
              ("Atlas", "uses pooler", "pgbouncer", "连接池用 pgbouncer")],
    B_ATLAS: [("Atlas", "uses database", "PostgreSQL", "Bob 的项目 Atlas 用 PostgreSQL"),
              ("Atlas", "hosted in", "机房 B3", "服务器在机房 B3，密码在 BOB-ONLY-99")],
}
BOB_WORDS = ("BOB-ONLY-99", "BOB-TUNE-77", "机房 B3", "Bob 的", B_ATLAS, B_TUNE)


def build(tmp, leanote, embedder, **sections) -> SimpleNamespace:
    """Both users' notes in the fake Leanote, indexed by one real sync pass, facts stored."""
    leanote.add_user(ALICE, "alice@example.com", PASSWORDS["LR_PW_ALICE"])
    leanote.add_user(BOB, "bob@example.com", PASSWORDS["LR_PW_BOB"])
    leanote.put_notebook({"NotebookId": A_BOOK, "UserId": ALICE, "Title": "工作"})
    leanote.put_notebook({"NotebookId": B_BOOK, "UserId": BOB, "Title": "Bob 工作"})
    for user, book, note_id, title, tags, content in NOTES:
        leanote.put_note({"NoteId": note_id, "UserId": user, "NotebookId": book, "Title": title, "Tags": tags,
                          "Content": content, "UpdatedTime": "2024-03-01T10:00:00.000+08:00"})

    def settings(**more):
        """The settings over this memory (``more``: other sections, e.g. a bot's; memory merged)."""
        given = {**sections, **more}
        return make_settings(
            tmp, leanote={"base_url": leanote.url},
            source={"kind": "leanote_api", "path": None, "accounts": [
                {"email": "alice@example.com", "password_env": "LR_PW_ALICE"},
                {"email": "bob@example.com", "password_env": "LR_PW_BOB"}]},
            memory={"llm": "off", "related_min_score": 0.3, **given.pop("memory", {})}, rerank={"kind": "none"},
            sync={"interval": "1h", "trigger_debounce": "0.1s"}, **given)

    base = settings()
    run_pass(base, embedder)
    with MemoryStore.open_for(base) as store:
        hashes = store.hashes()
        for note_id, facts in FACTS.items():
            user = ALICE if note_id == A_ATLAS else BOB
            rows = [{"subject": s, "predicate": p, "object": o, "quote": q, "char_start": 0, "char_end": len(q)}
                    for s, p, o, q in facts]
            assert store.store_llm({"note_id": note_id, "user_id": user, "content_hash": hashes[note_id],
                                    "updated": 1_709_258_400.0}, "", rows, {})
    return SimpleNamespace(settings=settings, leanote=leanote)


def facts_of(settings, user, name="Atlas") -> dict[str, dict]:
    """The user's facts about ``name`` by object."""
    with MemoryStore.open_for(settings) as store:
        return {f["object"]: f for f in store.facts_about(user, name)}


def verdicts(settings, user) -> dict:
    with MemoryStore.open_for(settings) as store:
        return store.verdicts(user, "fact") | store.verdicts(user, "pair")
