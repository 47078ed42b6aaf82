// The memory explorer: search an entity or a note, see its neighbourhood as a graph
// (vis-network), open a card (summary, facts with quotes, Leanote link), and reject or
// confirm a fact or a related pair. Everything comes from the daemon's /memory API;
// text from the notes is only ever set as text, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("leanote-rag-token") || "", user: null, view: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function say(text) { $("message").textContent = text || ""; }

class NeedToken extends Error {}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body) headers["Content-Type"] = "application/json";
  const reply = await fetch(path, { ...options, headers });
  if (reply.status === 401) throw new NeedToken();
  const body = await reply.json().catch(() => ({ error: `HTTP ${reply.status}` }));
  if (!reply.ok) throw new Error(body.error || `HTTP ${reply.status}`);
  return body;
}

function withUser(params) {
  if (state.user) params.user = state.user;
  return new URLSearchParams(params).toString();
}

// --- token and user ---------------------------------------------------------------------

function askToken(error) {
  $("login").hidden = false;
  $("login-error").textContent = error || "";
  $("token").focus();
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.token = $("token").value.trim();
  try {
    await start();
    sessionStorage.setItem("leanote-rag-token", state.token);
    $("login").hidden = true;
  } catch (err) {
    askToken(err instanceof NeedToken ? "that token is not known to the daemon" : err.message);
  }
});

async function start() {
  const { users } = await api("/users");
  const ids = Object.keys(users);
  const select = $("user");
  select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  select.hidden = ids.length < 2;
  state.user = ids[0] || null;
  if (!ids.length) say("no indexed notes this token may see");
}

$("user").addEventListener("change", () => {
  state.user = $("user").value;
  $("results").replaceChildren();
  $("card").replaceChildren();
  if (network) network.setData({ nodes: [], edges: [] });
});

// --- search -------------------------------------------------------------------------------

$("search").addEventListener("submit", (event) => { event.preventDefault(); run(search, $("q").value.trim()); });

async function run(work, ...args) {
  say("");
  try {
    await work(...args);
  } catch (err) {
    if (err instanceof NeedToken) askToken("the daemon wants a token");
    else say(err.message);
  }
}

async function search(q) {
  if (!q) return;
  const found = await api(`/memory/find?${withUser({ q })}`);
  const list = [];
  if (found.entities.length) list.push(el("h3", {}, "entities"));
  for (const e of found.entities) {
    list.push(el("button", { class: "hit entity", onclick: () => run(showEntity, e.name) },
      e.name, el("span", { class: "badge" }, `${e.kind} · ${e.notes}`)));
  }
  if (found.notes.length) list.push(el("h3", {}, "notes"));
  for (const n of found.notes) {
    list.push(el("button", { class: "hit note", onclick: () => run(showNote, n.note_id) }, n.title || n.note_id));
  }
  if (!list.length) list.push(el("p", { class: "empty" }, `nothing in the memory matches “${q}”`));
  $("results").replaceChildren(...list);
  if (found.entities.length) await showEntity(found.entities[0].name);
  else if (found.notes.length) await showNote(found.notes[0].note_id);
}

// --- graph --------------------------------------------------------------------------------

let network = null;
let shown = null; // the graph as the API gave it: its nodes by id

function draw(graph) {
  shown = new Map(graph.nodes.map((n) => [n.id, n]));
  const nodes = graph.nodes.map((n) => ({
    id: n.id,
    label: n.label.length > 28 ? `${n.label.slice(0, 27)}…` : n.label,
    title: n.type === "note" ? `${n.label}${n.notebook ? ` (${n.notebook})` : ""}` : `${n.label} · ${n.kind || "entity"}`,
    shape: n.type === "note" ? "box" : "ellipse",
    color: n.type === "note" ? "#dde8ff" : "#ffe9c6",
    borderWidth: n.id === graph.center ? 3 : 1,
  }));
  const edges = graph.edges.map((e) => ({
    id: e.id,
    from: e.from,
    to: e.to,
    label: e.type === "fact" ? e.label : e.type === "related" ? e.score.toFixed(2) : undefined,
    arrows: e.type === "fact" ? "to" : undefined,
    dashes: e.type === "mention" || e.status === "superseded",
    color: e.type === "related" ? "#7a7" : e.type === "fact" ? "#c77" : "#bbb",
    title: e.type === "fact" ? `“${e.quote}”` : undefined,
  }));
  if (!network) {
    network = new vis.Network($("graph"), { nodes, edges }, {
      physics: { stabilization: { iterations: 150 } },
      interaction: { hover: true },
      edges: { font: { size: 11, align: "middle" } },
    });
    network.on("click", (params) => {
      const node = params.nodes.length ? shown.get(params.nodes[0]) : null;
      if (!node) return;
      if (node.type === "note") run(showNote, node.note_id);
      else run(showEntity, node.label);
    });
  } else {
    network.setData({ nodes, edges });
  }
  window.explorerGraph = graph; // for people (and tests) who want to look at what is drawn
}

// --- cards --------------------------------------------------------------------------------

function date(when) {
  return when ? new Date(when * 1000).toISOString().slice(0, 10) : "";
}

function verdictButtons(id, what) {
  return el("span", { class: "actions" },
    el("button", { class: "confirm", "data-id": id, onclick: () => run(verdict, id, "confirmed", what) }, "✓ confirm"),
    el("button", { class: "reject", "data-id": id, onclick: () => run(verdict, id, "rejected", what) }, "✗ reject"));
}

function factBlock(f, withSource) {
  const badges = [el("span", { class: "badge" }, f.status)];
  if (f.confirmed) badges.push(el("span", { class: "badge confirmed" }, "confirmed"));
  return el("div", { class: `fact ${f.status}`, "data-fact": f.fact_id },
    el("div", { class: "triple" }, `${f.subject} —${f.predicate}→ ${f.object}`, ...badges),
    el("blockquote", {}, f.quote),
    // the note's title as text, its address behind a word of ours: a title is no link's words (one
    // titled "docs.python.org" would name a host the link does not go to)
    withSource && f.url ? el("div", { class: "meta" }, `${f.title || f.note_id} ${date(f.time)} `,
      el("a", { class: "source", href: f.url, target: "_blank", rel: "noopener" }, "open")) : null,
    el("div", { class: "meta" }, `id ${f.fact_id} `, verdictButtons(f.fact_id, "fact")));
}

async function showNote(noteId) {
  const [graph, card] = await Promise.all([
    api(`/memory/graph?${withUser({ note: noteId })}`),
    api(`/memory/note/${encodeURIComponent(noteId)}?${withUser({})}`),
  ]);
  state.view = () => showNote(noteId);
  draw(graph);
  const parts = [
    el("h2", { class: "title" }, card.title || card.note_id),
    el("div", { class: "meta" }, [card.notebook, card.updated_at].filter(Boolean).join(" · ")),
    el("p", {}, el("a", { class: "open", href: card.url, target: "_blank", rel: "noopener" }, "open in Leanote")),
    card.summary ? el("p", { class: "summary" }, card.summary) : el("p", { class: "empty" }, "no summary yet (the LLM tier has not read this note)"),
    el("h3", {}, "facts"),
    card.facts.length ? card.facts.map((f) => factBlock(f, false)) : el("p", { class: "empty" }, "no facts rest on this note"),
    el("h3", {}, "entities"),
    el("p", {}, card.entities.map((e) => el("button", { class: "entity", onclick: () => run(showEntity, e.name) }, e.name))),
    el("h3", {}, "related notes"),
  ];
  if (!card.related.length) parts.push(el("p", { class: "empty" }, "no related notes above the threshold"));
  for (const r of card.related) {
    const shared = (r.reasons.entities || []).map((e) => e.name).join(", ");
    parts.push(el("div", { class: "pair", "data-pair": r.pair_id },
      el("button", { class: "note", onclick: () => run(showNote, r.note_id) }, r.title || r.note_id),
      ` ${r.score.toFixed(2)}`,
      shared ? el("div", { class: "meta" }, `shared: ${shared}`) : null,
      el("div", { class: "meta" }, verdictButtons(r.pair_id, "pair"))));
  }
  $("card").replaceChildren(...parts.flat());
}

async function showEntity(name) {
  const [graph, card] = await Promise.all([
    api(`/memory/graph?${withUser({ entity: name })}`),
    api(`/memory/entity?${withUser({ name })}`),
  ]);
  state.view = () => showEntity(name);
  draw(graph);
  const parts = [
    el("h2", { class: "title" }, name),
    el("h3", {}, "facts"),
    card.facts.length ? card.facts.map((f) => factBlock(f, true)) : el("p", { class: "empty" }, "no facts about it"),
    el("h3", {}, `notes (${card.notes.length})`),
    card.notes.map((n) => el("div", { class: "pair" },
      el("button", { class: "note", onclick: () => run(showNote, n.note_id) }, n.title || n.note_id),
      n.snippet ? el("div", { class: "meta" }, n.snippet) : null)),
  ];
  $("card").replaceChildren(...parts.flat());
}

async function verdict(id, value, what) {
  const done = await api("/memory/verdict", { method: "POST", body: JSON.stringify({ id, verdict: value, user: state.user }) });
  say(done.changed ? `${what} ${id} ${value}` : `${what} ${id} was already ${value}`);
  if (state.view) await state.view();
}

// --- start: a token from the address (#token=...) or this tab's session, else none --------

(async () => {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) {
    state.token = fromHash;
    sessionStorage.setItem("leanote-rag-token", fromHash);
    history.replaceState(null, "", location.pathname + location.search);
  }
  try {
    await start();
  } catch (err) {
    if (err instanceof NeedToken) askToken(state.token ? "that token is not known to the daemon" : "");
    else say(err.message);
  }
})();
