"""What the memory answers: the doors' counts and entities, the entities a question names
and their notes and facts (``rag.answer.service``), the explorer's cards (``rag.memory.explore``).

A mixin of ``rag.memory.store.MemoryStore``."""

from __future__ import annotations

from typing import Iterable

from rag.memory import entities as extraction
from rag import limits
from rag.memory.entities import norm

from rag.memory.schema import MATCH_CHARS, IN_BATCH
from rag.memory.rows import correction_id, correction_target, matched_text


class Reads:
    # --- what the doors read ------------------------------------------------------------------

    def users(self) -> dict[str, int]:
        """Users with processed notes, and how many (the shape of ``store.count_by_user``)."""
        with self._lock:
            return dict(self.db.execute("SELECT user_id, COUNT(*) FROM notes GROUP BY user_id"))

    def entities(self, user_id: str, top: int | None = None, kind: str | None = None) -> list[dict]:
        """The user's entities, those mentioned by the most notes first, with counts."""
        sql = (
            "SELECT e.name, e.kind, COUNT(DISTINCT m.note_id) AS notes, COUNT(*) AS mentions "
            "FROM entities e JOIN mentions m ON m.entity_id = e.id "
            "WHERE e.user_id = ?" + (" AND e.kind = ?" if kind else "") +
            " GROUP BY e.id ORDER BY notes DESC, mentions DESC, e.norm, e.kind"
        )
        args: list = [user_id] + ([kind] if kind else [])
        if top is not None:
            sql += " LIMIT ?"
            args.append(top)
        with self._lock:
            rows = self.db.execute(sql, args).fetchall()
        return [{"name": n, "kind": k, "notes": c, "mentions": m} for n, k, c, m in rows]

    def entity(self, user_id: str, name: str) -> list[dict]:
        """The user's notes that mention ``name`` (any kind, compared by ``norm``), the most
        mentions first, each with its mentions."""
        with self._lock:
            rows = self.db.execute(
                "SELECT m.note_id, e.name, e.kind, m.point_id, m.char_start, m.char_end, m.snippet, "
                "n.title, n.notebook, n.url, n.updated_at "
                "FROM entities e JOIN mentions m ON m.entity_id = e.id JOIN notes n ON n.note_id = m.note_id "
                "WHERE e.user_id = ? AND m.user_id = ? AND e.norm = ? ORDER BY m.note_id, m.char_start",
                (user_id, user_id, matched_text(name)),
            ).fetchall()
        notes: dict[str, dict] = {}
        for note_id, ename, kind, point_id, start, end, snip, title, notebook, url, updated in rows:
            note = notes.setdefault(note_id, {"note_id": note_id, "title": title, "notebook": notebook, "url": url,
                                              "updated_at": updated, "kinds": [], "mentions": []})
            if kind not in note["kinds"]:
                note["kinds"].append(kind)
            note["mentions"].append({"name": ename, "kind": kind, "point_id": point_id, "char_start": start,
                                     "char_end": end, "snippet": snip})
        return sorted(notes.values(), key=lambda n: (-len(n["mentions"]), n["title"], n["note_id"]))

    def notes_for(self, user_id: str, names: Iterable[str]) -> list[tuple[str, list[str]]]:
        """The user's notes mentioning any of ``names``: (note id, the names it mentions),
        those mentioning the most names first."""
        keys = sorted({norm(n) for n in names if norm(n)})
        if not keys:
            return []
        with self._lock:
            rows = self.db.execute(
                f"SELECT DISTINCT m.note_id, e.norm FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(keys))})",
                (user_id, user_id, *keys),
            ).fetchall()
        found: dict[str, list[str]] = {}
        for note_id, key in rows:
            found.setdefault(note_id, []).append(key)
        return sorted(((n, sorted(k)) for n, k in found.items()), key=lambda p: (-len(p[1]), p[0]))

    def counts(self, user_id: str | None = None) -> dict:
        """Notes processed by tier, entities, mentions (``status``)."""
        where, args = ("WHERE user_id = ?", (user_id,)) if user_id is not None else ("", ())
        with self._lock:
            tiers = dict(self.db.execute(f"SELECT tier, COUNT(*) FROM notes {where} GROUP BY tier", args))
            entities = self.db.execute(f"SELECT COUNT(*) FROM entities {where}", args).fetchone()[0]
            mentions = self.db.execute(f"SELECT COUNT(*) FROM mentions {where}", args).fetchone()[0]
        return {"notes": tiers, "entities": entities, "mentions": mentions}

    # --- for answers (rag.answer.service: entities named in a question, their notes and facts) ------

    def named_in(self, user_id: str, text: str) -> list[dict]:
        """The user's entities whose key (``norm``) occurs in ``text`` (compared as ``norm``;
        its first ``MATCH_CHARS``), one row per key: its name, kinds, how many notes and
        mentions it has.

        The names are found by walking the text once, looking each position's two characters
        up among the user's names (``_names``), so the work grows with the text, not with the
        text times the number of names; then only the names found are read."""
        key = matched_text(text)
        if not key:
            return []
        names = self._names(user_id)
        found = set()
        for i in range(len(key)):
            for start in {key[i : i + 2], key[i]}:
                found.update(n for n in names.get(start, ()) if key.startswith(n, i))
        rows: list[tuple] = []
        keys = sorted(found)
        with self._lock:
            for at in range(0, len(keys), IN_BATCH):
                batch = keys[at : at + IN_BATCH]
                rows += self.db.execute(
                    "SELECT e.norm, MIN(e.name), GROUP_CONCAT(DISTINCT e.kind), COUNT(DISTINCT m.note_id), COUNT(*) "
                    "FROM entities e JOIN mentions m ON m.entity_id = e.id "
                    f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(batch))}) GROUP BY e.norm",
                    (user_id, user_id, *batch),
                ).fetchall()
        return [{"norm": k, "name": n, "kinds": sorted(set(kinds.split(","))), "notes": c, "mentions": m}
                for k, n, kinds, c, m in sorted(rows)]

    def _names(self, user_id: str) -> dict[str, list[str]]:
        """The user's entity keys by their first two characters (a one-character key by its
        character), kept until the file changes (``PRAGMA data_version`` tells another
        connection's commits; ``_writes`` this one's)."""
        with self._lock:
            version = (self.db.execute("PRAGMA data_version").fetchone()[0], self._writes)
            cached = self._name_index.get(user_id)
            if cached is not None and cached[0] == version:
                return cached[1]
            keys = [k for (k,) in self.db.execute("SELECT DISTINCT norm FROM entities WHERE user_id = ?", (user_id,))]
        names: dict[str, list[str]] = {}
        for k in keys:
            if k:
                names.setdefault(k[:2], []).append(k)
        self._name_index[user_id] = (version, names)
        return names

    def chunks_mentioning(self, user_id: str, norms: Iterable[str]) -> list[tuple[str, str, str, int]]:
        """The chunks holding a mention of any of ``norms``: (point id, note id, norm, mentions
        of it in that chunk). Mentions without a chunk (tags) are left out."""
        keys = sorted({norm(n) for n in norms if norm(n)})
        if not keys:
            return []
        llm = ",".join(f"'{k}'" for k in extraction.LLM_KINDS)
        with self._lock:
            return self.db.execute(
                f"SELECT m.point_id, m.note_id, e.norm, COUNT(*) FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND m.point_id IS NOT NULL "
                f"AND e.norm IN ({','.join('?' * len(keys))}) "
                # a place the LLM typed that the no-LLM tier holds too counts once (as the no-LLM's)
                f"AND NOT (e.kind IN ({llm}) AND EXISTS (SELECT 1 FROM mentions o JOIN entities oe ON oe.id = o.entity_id "
                f"  WHERE o.note_id = m.note_id AND o.char_start = m.char_start AND oe.norm = e.norm "
                f"  AND oe.kind NOT IN ({llm}))) "
                f"GROUP BY m.point_id, m.note_id, e.norm",
                (user_id, user_id, *keys),
            ).fetchall()

    def notes_mentioning(self, user_id: str, norms: Iterable[str]) -> list[dict]:
        """The user's notes mentioning any of ``norms``, newest (updated) first: the fields of
        a ``search --json`` hit plus ``updated_at``, ``mentions`` and one ``snippet``."""
        keys = sorted({norm(n) for n in norms if norm(n)})
        if not keys:
            return []
        with self._lock:
            rows = self.db.execute(
                f"SELECT n.note_id, n.title, n.notebook, n.url, n.updated_at, COUNT(*), "
                f"MAX(CASE WHEN m.snippet != '' THEN m.snippet END) "
                f"FROM entities e JOIN mentions m ON m.entity_id = e.id "
                f"JOIN notes n ON n.note_id = m.note_id AND n.user_id = m.user_id "
                f"WHERE e.user_id = ? AND m.user_id = ? AND e.norm IN ({','.join('?' * len(keys))}) "
                f"GROUP BY n.note_id ORDER BY n.updated_at DESC, n.title, n.note_id",
                (user_id, user_id, *keys),
            ).fetchall()
        return [{"note_id": i, "title": t, "notebook": nb, "url": u, "updated_at": up, "mentions": c,
                 "snippet": snip or ""} for i, t, nb, u, up, c, snip in rows]

    def facts_named(self, user_id: str, text: str, subjects: Iterable[str] = (), limit: int = 20) -> list[dict]:
        """Active facts whose subject is one of ``subjects`` (compared as ``norm``) or occurs
        in ``text``, the newest first, each with its source note's title, notebook and url.

        One query on ``facts_subject_norm``: only the user's active facts' subject keys are
        compared with the text, and only the facts that match are read. Not by ``named_in``:
        a fact's subject (the LLM's) need not be an entity the no-LLM tier found."""
        keys = sorted({norm(s) for s in subjects if norm(s)})
        key = matched_text(text)
        if not keys and not key:
            return []
        listed = f"f.subject_norm IN ({','.join('?' * len(keys))}) OR " if keys else ""
        with self._lock:
            rows = self.db.execute(
                "SELECT f.id, f.subject, f.predicate, f.object, f.quote, f.note_id, f.time, "
                "n.title, n.notebook, n.url FROM facts f JOIN notes n ON n.note_id = f.note_id AND n.user_id = f.user_id "
                "WHERE f.user_id = ? AND f.status = 'active' AND f.subject_norm != '' "
                f"AND ({listed}instr(?, f.subject_norm) > 0) AND length(f.subject) >= 2 "
                "ORDER BY f.time DESC, f.id DESC LIMIT ?", (user_id, *keys, key, limit),
            ).fetchall()
        return [{"id": fid, "subject": subject, "predicate": predicate, "object": obj, "quote": quote,
                 "note_id": note_id, "time": when, "title": title, "notebook": notebook, "url": url}
                for fid, subject, predicate, obj, quote, note_id, when, title, notebook, url in rows]

    # --- end of for answers ---------------------------------------------------------------------

    # --- for the explorer (rag.memory.explore, served by the daemon's API) ------------------------------

    def find(self, user_id: str, text: str, limit: int = 20) -> dict:
        """What a search box finds: the user's entities (and fact subjects and objects) whose
        name contains ``text`` (as ``norm``), the exact name first, then those in most notes;
        and the notes whose title contains it or whose id it is (``text``: its first ``MATCH_CHARS``)."""
        text = limits.cut(text, MATCH_CHARS)[0]
        key = norm(text)
        if not key:
            return {"entities": [], "notes": []}
        like = "%" + key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            entities = self.db.execute(
                "SELECT e.name, e.kind, COUNT(DISTINCT m.note_id) AS notes FROM entities e "
                "JOIN mentions m ON m.entity_id = e.id WHERE e.user_id = ? AND e.norm LIKE ? ESCAPE '\\' "
                "GROUP BY e.id ORDER BY e.norm = ? DESC, notes DESC, length(e.norm), e.norm LIMIT ?",
                (user_id, like, key, limit)).fetchall()
            named = self.db.execute(
                "SELECT name, COUNT(DISTINCT note_id) FROM (SELECT subject AS name, note_id FROM facts WHERE user_id = ? "
                "UNION ALL SELECT object, note_id FROM facts WHERE user_id = ?) GROUP BY name", (user_id, user_id)
            ).fetchall()
            notes = self.db.execute(
                "SELECT note_id, title, notebook, url, updated_at FROM notes WHERE user_id = ? AND "
                "(note_id = ? OR lower(title) LIKE lower(?) ESCAPE '\\') ORDER BY note_id = ? DESC, updated_at DESC "
                "LIMIT ?", (user_id, text.strip(), like, text.strip(), limit)).fetchall()
        found = {norm(n): {"name": n, "kind": k, "notes": c} for n, k, c in entities}
        for name, count in named:  # what only the LLM tier's facts name
            if key in norm(name) and norm(name) not in found:
                found[norm(name)] = {"name": name, "kind": "fact", "notes": count}
        ranked = sorted(found.items(), key=lambda kv: (kv[0] != key, -kv[1]["notes"], len(kv[0]), kv[0]))
        return {"entities": [e for _, e in ranked[:limit]],
                "notes": [{"note_id": i, "title": t, "notebook": nb, "url": u, "updated_at": up}
                          for i, t, nb, u, up in notes]}

    def note_entities(self, user_id: str, note_id: str, limit: int = 12) -> list[dict]:
        """The entities a note mentions, the most mentioned in it first and, among equals, the
        rarest in the user's notes (the most telling)."""
        with self._lock:
            rows = self.db.execute(
                "SELECT e.name, e.kind, COUNT(*) AS here, (SELECT COUNT(DISTINCT o.note_id) FROM mentions o "
                "WHERE o.entity_id = e.id) AS notes FROM entities e JOIN mentions m ON m.entity_id = e.id "
                "WHERE e.user_id = ? AND m.user_id = ? AND m.note_id = ? GROUP BY e.id "
                "ORDER BY here DESC, notes, e.norm LIMIT ?", (user_id, user_id, note_id, limit)).fetchall()
        return [{"name": n, "kind": k, "mentions": here, "notes": c} for n, k, here, c in rows]

    def note_facts(self, user_id: str, note_id: str) -> list[dict]:
        """The facts that rest on a note (every status), with the fields of ``facts_about``."""
        with self._lock:
            rows = self.db.execute(
                "SELECT f.subject, f.predicate, f.object, f.quote, f.time, f.status, s.note_id FROM facts f "
                "LEFT JOIN facts s ON s.id = f.superseded_by WHERE f.user_id = ? AND f.note_id = ? "
                "ORDER BY f.char_start, f.id", (user_id, note_id)).fetchall()
            verdicts = dict(self.db.execute(
                "SELECT target, verdict FROM corrections WHERE user_id = ? AND kind = 'fact'", (user_id,)).fetchall())
        out = []
        for subject, predicate, obj, quote, when, status, by_note in rows:
            target = correction_target("fact", subject, predicate, obj)
            out.append({"fact_id": correction_id(user_id, "fact", target), "subject": subject, "predicate": predicate,
                        "object": obj, "quote": quote, "note_id": note_id, "time": when, "status": status,
                        "superseded_by_note": by_note, "confirmed": verdicts.get(target) == "confirmed"})
        return out

    def note_card(self, user_id: str, note_id: str) -> dict | None:
        """A processed note of the user as the explorer shows it, or None."""
        with self._lock:
            row = self.db.execute(
                "SELECT title, notebook, url, updated_at, summary, tier FROM notes WHERE note_id = ? AND user_id = ?",
                (note_id, user_id)).fetchone()
        if row is None:
            return None
        title, notebook, url, updated, summary, tier = row
        return {"note_id": note_id, "title": title, "notebook": notebook, "url": url, "updated_at": updated,
                "summary": summary, "tier": tier}

    # --- end of for the explorer --------------------------------------------------------------------
