"""The explorer's view of the memory: neighbourhood graphs and cards, as plain data.

The daemon's API serves these (``GET /memory/...``) to the explorer page, which draws
them with vis-network; everything here reads one user's memory only (``MemoryStore``
calls are all keyed by the user), so a page can never show another user's notes.

A graph is ``{"center", "nodes", "edges"}``. Node ids are ``e:<norm>`` for an entity
(a term, a code identifier, a tag, a heading, a link label, or a name a fact uses) and
``n:<note id>`` for a note. Edges are ``mention`` (note to entity), ``fact`` (subject to
object, labelled with the predicate, carrying the fact's correction id and status) and
``related`` (note to note, with the pair's id and score).
"""

from __future__ import annotations

from rag.memory.entities import norm
from rag.memory.rows import correction_id, correction_target
from rag.memory.store import MemoryStore

MAX_NOTES = 15  # notes around an entity
MAX_ENTITIES = 12  # entities around a note
MAX_RELATED = 8


class _Graph:
    def __init__(self, center: str):
        self.center = center
        self.nodes: dict[str, dict] = {}
        self.edges: dict[str, dict] = {}

    def entity(self, name: str, kind: str = "", notes: int | None = None) -> str:
        node_id = f"e:{norm(name)}"
        if node_id not in self.nodes:
            self.nodes[node_id] = {"id": node_id, "type": "entity", "label": name, "kind": kind, "notes": notes}
        return node_id

    def note(self, note: dict) -> str:
        node_id = f"n:{note['note_id']}"
        if node_id not in self.nodes:
            self.nodes[node_id] = {"id": node_id, "type": "note", "label": note.get("title") or note["note_id"],
                                   "note_id": note["note_id"], "notebook": note.get("notebook", ""),
                                   "url": note.get("url", "")}
        return node_id

    def edge(self, key: str, kind: str, a: str, b: str, **fields) -> None:
        self.edges.setdefault(key, {"id": key, "type": kind, "from": a, "to": b, **fields})

    def fact(self, f: dict) -> None:
        self.edge(f"f:{f['fact_id']}", "fact", self.entity(f["subject"]), self.entity(f["object"]),
                  label=f["predicate"], fact_id=f["fact_id"], status=f["status"], confirmed=f["confirmed"],
                  quote=f["quote"], note_id=f["note_id"])

    def as_json(self) -> dict:
        return {"center": self.center, "nodes": list(self.nodes.values()), "edges": list(self.edges.values())}


def _related(g: _Graph, store: MemoryStore, user_id: str, note_ids: list[str], limit: int) -> None:
    """Pairs among (or out of) the graph's notes, each with the id ``memory reject|confirm`` takes."""
    for a in note_ids:
        for r in store.related_of(user_id, a, limit):
            key = correction_target("pair", a, r["note_id"])
            g.edge(f"p:{key}", "related", f"n:{a}", g.note(r), score=r["score"],
                   pair_id=correction_id(user_id, "pair", key))


def entity_graph(store: MemoryStore, user_id: str, name: str) -> dict:
    """An entity, the notes that mention it (most mentions first), the facts it takes part
    in (both ways, superseded ones too) and the related pairs among those notes."""
    g = _Graph(f"e:{norm(name)}")
    notes = store.entity(user_id, name)[:MAX_NOTES]
    facts = store.facts_about(user_id, name)
    if not notes and not facts:
        return {**g.as_json(), "nodes": []}
    kinds = sorted({k for n in notes for k in n["kinds"]})
    center = g.entity(notes[0]["mentions"][0]["name"] if notes else name, "/".join(kinds) or "fact",
                      len(notes) or None)
    for n in notes:
        g.edge(f"m:{n['note_id']}:{center}", "mention", g.note(n), center, mentions=len(n["mentions"]))
    for f in facts:
        g.fact(f)
    shown = [n["note_id"] for n in notes]
    for a in shown:  # only pairs between notes already shown: the entity's neighbourhood
        for r in store.related_of(user_id, a):
            if r["note_id"] in shown and a < r["note_id"]:
                key = correction_target("pair", a, r["note_id"])
                g.edge(f"p:{key}", "related", f"n:{a}", f"n:{r['note_id']}", score=r["score"],
                       pair_id=correction_id(user_id, "pair", key))
    return g.as_json()


def note_graph(store: MemoryStore, user_id: str, note_id: str) -> dict | None:
    """A note, the entities it mentions, the facts that rest on it and its related notes;
    None when the user has no such note."""
    card = store.note_card(user_id, note_id)
    if card is None:
        return None
    g = _Graph(f"n:{note_id}")
    me = g.note(card)
    for e in store.note_entities(user_id, note_id, MAX_ENTITIES):
        g.edge(f"m:{note_id}:{norm(e['name'])}", "mention", me, g.entity(e["name"], e["kind"], e["notes"]),
               mentions=e["mentions"])
    for f in store.note_facts(user_id, note_id):
        g.fact(f)
    _related(g, store, user_id, [note_id], MAX_RELATED)
    return g.as_json()


def note_card(store: MemoryStore, user_id: str, note_id: str) -> dict | None:
    """What the page shows for a note: title, notebook, link, summary (the LLM tier's),
    the facts resting on it with their quotes and ids, its entities and related notes
    with their reasons and pair ids; None when the user has no such note."""
    card = store.note_card(user_id, note_id)
    if card is None:
        return None
    related = store.related_of(user_id, note_id, MAX_RELATED)
    for r in related:
        r["pair_id"] = correction_id(user_id, "pair", correction_target("pair", note_id, r["note_id"]))
    return {**card, "facts": store.note_facts(user_id, note_id),
            "entities": store.note_entities(user_id, note_id, MAX_ENTITIES), "related": related}


def entity_card(store: MemoryStore, user_id: str, name: str) -> dict:
    """What the page shows for an entity: its facts (with quotes, sources and ids) and the
    notes that mention it, with a snippet each."""
    return card_of(name, store.facts_about(user_id, name), store.entity(user_id, name))


def card_of(name: str, facts: list[dict], notes: list[dict]) -> dict:
    """An entity's card from its facts and the notes that mention it (``MemoryStore.entity``):
    each note with how often it mentions it and its first snippet."""
    return {"entity": name, "facts": facts,
            "notes": [{k: n[k] for k in ("note_id", "title", "notebook", "url", "updated_at", "kinds")}
                      | {"mentions": len(n["mentions"]),
                         "snippet": next((m["snippet"] for m in n["mentions"] if m["snippet"]), "")}
                      for n in notes]}


def note_ids_in(data) -> set[str]:
    """Every note id ``data`` (a card, a graph, rows of facts or notes) names."""
    found: set[str] = set()

    def walk(x) -> None:
        if isinstance(x, dict):
            for key in ("note_id", "superseded_by_note"):
                if isinstance(x.get(key), str) and x[key]:
                    found.add(x[key])
            for key in ("id", "from", "to"):
                if isinstance(x.get(key), str) and x[key].startswith("n:"):
                    found.add(x[key][2:])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data)
    return found


def indexed_only(data, held: set[str]):
    """``data`` without what names a note outside ``held`` (the notes the index holds): a row,
    fact, node or edge of such a note goes. The memory loses a note that leaves the index in
    the same pass, unless its write fails (``memory.sqlite`` locked): until the next pass
    repairs it, no door names the note."""
    def keep(x) -> bool:
        if not isinstance(x, dict):
            return True
        if isinstance(x.get("note_id"), str) and x["note_id"] and x["note_id"] not in held:
            return False
        return not any(isinstance(x.get(k), str) and x[k].startswith("n:") and x[k][2:] not in held
                       for k in ("id", "from", "to"))

    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x if keep(v)]
        return x

    return walk(data)
