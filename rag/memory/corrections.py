"""Corrections: a person's verdicts on facts and related pairs, keyed by content so they
outlive re-extraction, with their history, export and import.

A mixin of ``rag.memory.store.MemoryStore``."""

from __future__ import annotations

import json
import sqlite3
from typing import Sequence

from rag.memory.entities import norm
from rag.errors import UserError
from rag.limits import echoed

from rag.memory.rows import correction_id, correction_target, matched_text, settle_group, target_fields


CORRECTIONS_VERSION = 1


def parse_corrections(data: object) -> list[dict]:
    """Check an export's shape; its records with their ``target``. UserError naming the
    first bad record."""
    if not isinstance(data, dict) or data.get("version") != CORRECTIONS_VERSION or not isinstance(
            data.get("corrections"), list):
        raise UserError(f"not a corrections file: expected {{\"version\": {CORRECTIONS_VERSION}, \"corrections\": "
                        f"[...]}} as `leanote-rag memory export` writes it")
    out = []
    for i, r in enumerate(data["corrections"], start=1):
        def bad(why: str) -> UserError:
            return UserError(f"correction {i}: {why}; nothing was imported")

        if not isinstance(r, dict):
            raise bad("not an object")
        user, kind, verdict, at = r.get("user_id"), r.get("kind"), r.get("verdict"), r.get("at", 0.0)
        if not isinstance(user, str) or not user:
            raise bad("user_id missing")
        if verdict not in ("rejected", "confirmed"):
            raise bad(f"verdict must be rejected or confirmed, not {echoed(verdict)!r}")
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            raise bad("at must be a time in seconds")
        if kind == "fact":
            content = [r.get(k) for k in ("subject", "predicate", "object")]
            if not all(isinstance(c, str) and norm(c) for c in content):
                raise bad("a fact needs subject, predicate and object (text)")
        elif kind == "pair":
            content = r.get("notes")
            if (not isinstance(content, list) or len(content) != 2 or not all(isinstance(n, str) and n for n in content)
                    or content[0] == content[1]):
                raise bad("a pair needs notes: two different note ids")
        else:
            raise bad(f"kind must be fact or pair, not {echoed(kind)!r}")
        out.append({"user_id": user, "kind": kind, "verdict": verdict, "at": float(at),
                    "target": correction_target(kind, *content), "shown": list(content)})
    return out


class Corrections:
    # --- corrections --------------------------------------------------------------------------
    # A person's verdict on a fact or a related pair, per Leanote user, keyed by content and
    # not by row id, so it outlives re-extraction: a fact by its (subject, predicate, object),
    # a pair by its two notes in either order (``correction_target``). ``rejected`` is a
    # tombstone: the rows go now and ``store_llm``/``replace_related`` never write them
    # again. ``confirmed`` marks the fact or pair; a confirmed fact is still superseded by a
    # newer note stating another object (the notes are the truth), and the doors show it as
    # confirmed and superseded, never dropped quietly. The ids the doors show
    # (``correction_id``) are derived from the user and the content, so they are stable
    # across re-extraction and no other user's id resolves. Every verdict is logged in
    # ``correction_log``.

    def resolve_correction(self, user_id: str, item_id: str) -> dict:
        """What a fact or pair id of the user names: kind, target (content), id; the fact
        rows or pair it covers now (none once rejected). UserError when it is not the user's."""
        item_id = item_id.strip()
        kind = {"f": "fact", "p": "pair"}.get(item_id[:1])
        if kind is None or len(item_id) != 13:
            raise UserError(f"{echoed(item_id)!r} is not a fact or pair id (f… or p…, 13 characters, as `leanote-rag memory "
                            f"ENTITY` and `leanote-rag related` show them)")
        with self._lock:
            if kind == "fact":
                rows = self.db.execute("SELECT subject, predicate, object FROM facts WHERE user_id = ?",
                                       (user_id,)).fetchall()
                targets = [(correction_target("fact", *r), list(r)) for r in rows]
            else:
                rows = self.db.execute("SELECT note_a, note_b FROM related WHERE user_id = ? AND note_a < note_b",
                                       (user_id,)).fetchall()
                targets = [(correction_target("pair", *r), list(r)) for r in rows]
            targets += [(t, json.loads(c) if c else None) for t, c in self.db.execute(
                "SELECT target, comment FROM corrections WHERE user_id = ? AND kind = ?", (user_id, kind))]
        for target, shown in targets:
            if correction_id(user_id, kind, target) == item_id:
                return {"id": item_id, "kind": kind, "target": target, "user_id": user_id, "shown": shown}
        raise UserError(f"no {kind} {item_id} in the memory of user {echoed(user_id)} (ids are per user: "
                        f"`leanote-rag memory ENTITY --user {echoed(user_id)}` lists the facts, `related` the pairs)")

    def correct(self, user_id: str, item_id: str, verdict: str, by: str = "cli") -> dict:
        """Reject or confirm the user's fact or pair ``item_id``; what was done (``changed``
        False when it already had that verdict, ``removed`` the rows a rejection deleted)."""
        found = self.resolve_correction(user_id, item_id)
        return self.apply_correction(user_id, found["kind"], found["target"], verdict, by=by, shown=found["shown"])

    def apply_correction(self, user_id: str, kind: str, target: str, verdict: str, *, by: str = "cli",
                         at: float | None = None, shown: Sequence[str] | None = None) -> dict:
        """Record a verdict on a target (``correction_target``; ``shown``: the content as
        written, kept to show it); a rejection deletes the fact rows (their groups settled
        again) or both rows of the pair."""
        if verdict not in ("rejected", "confirmed") or kind not in ("fact", "pair"):
            raise UserError(f"cannot record {verdict!r} on a {kind!r}")
        when = self.clock() if at is None else at

        def work(db: sqlite3.Connection) -> dict:
            row = db.execute("SELECT verdict, comment FROM corrections WHERE user_id = ? AND kind = ? AND target = ?",
                             (user_id, kind, target)).fetchone()
            changed = row is None or row[0] != verdict
            comment = json.dumps(list(shown), ensure_ascii=False) if shown else (row[1] if row else None)
            if changed:
                db.execute("INSERT OR REPLACE INTO corrections(user_id, kind, target, verdict, comment, at) "
                           "VALUES (?,?,?,?,?,?)", (user_id, kind, target, verdict, comment, when))
                db.execute("INSERT INTO correction_log(user_id, kind, target, verdict, by, at) VALUES (?,?,?,?,?,?)",
                           (user_id, kind, target, verdict, by, when))
            removed = 0
            if verdict == "rejected":
                content = json.loads(target)
                if kind == "fact":
                    ids = [(i, s, p) for i, s, p, o in db.execute(
                        "SELECT id, subject, predicate, object FROM facts WHERE user_id = ?", (user_id,))
                        if correction_target("fact", s, p, o) == target]
                    db.executemany("DELETE FROM facts WHERE id = ?", [(i,) for i, _, _ in ids])
                    for subject, predicate in {(s, p) for _, s, p in ids}:
                        settle_group(db, user_id, subject, predicate)
                    removed = len(ids)
                else:
                    a, b = content
                    removed = db.execute("DELETE FROM related WHERE user_id = ? AND ((note_a = ? AND note_b = ?) "
                                         "OR (note_a = ? AND note_b = ?))", (user_id, a, b, b, a)).rowcount
            return {"id": correction_id(user_id, kind, target), "kind": kind, "user_id": user_id,
                    "verdict": verdict, "changed": changed, "removed": removed,
                    **target_fields(kind, target, comment)}

        return self._write(work)

    def verdicts(self, user_id: str, kind: str) -> dict[str, str]:
        """The user's verdicts on facts or pairs: target -> verdict."""
        with self._lock:
            return dict(self.db.execute("SELECT target, verdict FROM corrections WHERE user_id = ? AND kind = ?",
                                        (user_id, kind)))

    def correction_history(self, user_id: str, item_id: str) -> dict:
        """A fact's or pair's verdict and its log (who, when, what); for a fact also its rows now
        and its group's supersession history (same subject and predicate, newest first, each
        with its source note), for a pair its rows now."""
        found = self.resolve_correction(user_id, item_id)
        kind, target = found["kind"], found["target"]
        with self._lock:
            row = self.db.execute("SELECT verdict, at FROM corrections WHERE user_id = ? AND kind = ? AND target = ?",
                                  (user_id, kind, target)).fetchone()
            log = [{"verdict": v, "by": b, "at": a} for v, b, a in self.db.execute(
                "SELECT verdict, by, at FROM correction_log WHERE user_id = ? AND kind = ? AND target = ? ORDER BY at, id",
                (user_id, kind, target))]
        shown = json.dumps(found["shown"], ensure_ascii=False) if found["shown"] else None
        out = {"id": item_id, "kind": kind, "user_id": user_id, **target_fields(kind, target, shown),
               "verdict": row[0] if row else None, "verdict_at": row[1] if row else None, "log": log}
        if kind == "fact":
            subject, predicate, _ = json.loads(target)
            group = [f for f in self.facts_about(user_id, subject) if norm(f["predicate"]) == predicate]
            out["rows"] = [f for f in group if f["fact_id"] == item_id]
            out["supersession"] = group
        else:
            a, b = json.loads(target)
            with self._lock:
                rows = self.db.execute("SELECT note_a, note_b, score, computed_at FROM related WHERE user_id = ? "
                                       "AND note_a = ? AND note_b = ?", (user_id, a, b)).fetchall()
            out["rows"] = [{"note_a": x, "note_b": y, "score": round(s, 4), "computed_at": c} for x, y, s, c in rows]
            out["notes"] = [self.note_info(user_id, n) or {"note_id": n} for n in (a, b)]
        return out

    def facts_about(self, user_id: str, name: str) -> list[dict]:
        """The user's facts whose subject or object is ``name`` (compared as ``norm``), newest
        first: the fact and its quote, ``fact_id``, its source note (title, notebook, url,
        updated_at), status, what superseded it, and ``confirmed``."""
        key = matched_text(name)
        with self._lock:
            rows = self.db.execute(
                "SELECT f.subject, f.predicate, f.object, f.quote, f.note_id, f.time, f.status, s.note_id, "
                "n.title, n.notebook, n.url, n.updated_at FROM facts f LEFT JOIN facts s ON s.id = f.superseded_by "
                "LEFT JOIN notes n ON n.note_id = f.note_id AND n.user_id = f.user_id WHERE f.user_id = ? "
                "ORDER BY f.time DESC, f.id DESC", (user_id,)).fetchall()
            confirmed = {t for (t,) in self.db.execute(
                "SELECT target FROM corrections WHERE user_id = ? AND kind = 'fact' AND verdict = 'confirmed'",
                (user_id,))}
        out = []
        for subject, predicate, obj, quote, note_id, when, status, by_note, title, notebook, url, updated in rows:
            if key not in (norm(subject), norm(obj)):
                continue
            target = correction_target("fact", subject, predicate, obj)
            out.append({"fact_id": correction_id(user_id, "fact", target), "subject": subject, "predicate": predicate,
                        "object": obj, "quote": quote, "note_id": note_id, "title": title or "",
                        "notebook": notebook or "", "url": url or "", "updated_at": updated or "", "time": when,
                        "status": status, "superseded_by_note": by_note, "confirmed": target in confirmed})
        return out

    def export_corrections(self, user_id: str | None = None) -> dict:
        """Every verdict (of one user, or all), with its log: the ``memory export`` file."""
        where, args = (" WHERE user_id = ?", (user_id,)) if user_id is not None else ("", ())
        with self._lock:
            rows = self.db.execute(f"SELECT user_id, kind, target, verdict, at, comment FROM corrections{where} "
                                   f"ORDER BY user_id, at, id", args).fetchall()
            logs: dict[tuple, list] = {}
            for u, k, t, v, b, a in self.db.execute(
                    f"SELECT user_id, kind, target, verdict, by, at FROM correction_log{where} ORDER BY at, id", args):
                logs.setdefault((u, k, t), []).append({"verdict": v, "by": b, "at": a})
        return {"version": CORRECTIONS_VERSION, "corrections": [
            {"user_id": u, "kind": k, **target_fields(k, t, c), "verdict": v, "at": a, "log": logs.get((u, k, t), [])}
            for u, k, t, v, a, c in rows]}

    def import_corrections(self, data: object, user_id: str | None = None, by: str = "import") -> dict:
        """Apply an export (all of it, or one user's records): validated first (UserError
        naming the bad record, nothing applied), then each verdict recorded unless it is
        already there. Counts of applied and unchanged records, and the applied ones."""
        records = parse_corrections(data)
        if user_id is not None:
            records = [r for r in records if r["user_id"] == user_id]
        applied, unchanged = [], 0
        for r in records:
            done = self.apply_correction(r["user_id"], r["kind"], r["target"], r["verdict"], by=by, at=r["at"],
                                         shown=r["shown"])
            if done["changed"]:
                applied.append(done)
            else:
                unchanged += 1
        return {"records": len(records), "applied": len(applied), "unchanged": unchanged, "changes": applied}

    # --- end of corrections ----------------------------------------------------------------------
