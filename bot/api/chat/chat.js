// The web chat: ask your notes with the answer streaming in, its sources as links to the notes,
// 👍 / 👎, "Why?", "Save as note", related notes; the questions your notes could not answer
// (write the note, or dismiss); capture a note. Everything goes through the daemon's API, signed
// in by a session cookie (an API token, or the one-time link a bot's /web gives). Text from the
// notes or the model is only ever set as text; the answer's HTML (rendered by the API, every
// address inert) is rebuilt here from an allow-list of tags, never assigned as innerHTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { csrf: "", person: "", users: [], user: null, conversation: "", once: "" };

function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // (randomUUID needs https)
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function say(text) { $("message").textContent = text || ""; }

class NeedSignin extends Error {}

async function api(path, { method = "GET", body, params } = {}) {
  const query = new URLSearchParams(params || {});
  if (state.user) query.set("user", state.user);
  const url = query.toString() ? `${path}?${query}` : path;
  const headers = { "X-CSRF-Token": state.csrf };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const reply = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (reply.status === 401 && !path.startsWith("/chat/signin")) throw new NeedSignin();
  const data = await reply.json().catch(() => ({ error: `HTTP ${reply.status}` }));
  if (!reply.ok) throw new Error(data.error || `HTTP ${reply.status}`);
  return data;
}

function failed(err) {
  if (err instanceof NeedSignin) showSignin("Signed out: sign in again. / 请重新登录。");
  else say(err.message);
}

// --- signing in -----------------------------------------------------------------------------

function showSignin(error) {
  $("chat").hidden = true;
  $("nav").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = error || "";
}

async function whoami() {
  const me = await api("/chat/me");
  Object.assign(state, { csrf: me.csrf, person: me.person, users: me.users, user: me.users[0] || null });
  state.conversation = sessionStorage.getItem("lr-conversation") || newId();
  sessionStorage.setItem("lr-conversation", state.conversation);
  const select = $("user");
  select.replaceChildren(...me.users.map((u) => el("option", { value: u }, u)));
  select.hidden = me.users.length < 2;
  $("signin").hidden = true;
  $("chat").hidden = false;
  $("nav").hidden = false;
  $("q").focus();
}

async function signIn(body) {
  const reply = await api("/chat/signin", { method: "POST", body });
  state.csrf = reply.csrf;
  await whoami();
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await signIn({ token: $("token").value.trim() });
    $("token").value = "";
  } catch (err) {
    showSignin(err.message);
  }
});

$("signout").addEventListener("click", async () => {
  try { await api("/chat/signout", { method: "POST" }); } catch (err) { /* signed out anyway */ }
  $("log").replaceChildren();
  showSignin("");
});

$("user").addEventListener("change", () => { state.user = $("user").value; });

async function boot() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (code) {
    history.replaceState(null, "", location.pathname); // the code leaves the address bar at once
    try {
      await signIn({ code });
      return;
    } catch (err) {
      return showSignin(err.message);
    }
  }
  try {
    await whoami();
  } catch (err) {
    showSignin(err instanceof NeedSignin ? "" : err.message);
  }
}

// --- the answer's HTML, rebuilt from an allow-list --------------------------------------------

const BLOCKS = new Set(["P", "UL", "OL", "LI", "H1", "H2", "H3", "H4", "H5", "H6", "BLOCKQUOTE", "TABLE", "THEAD",
  "TBODY", "TR", "TH", "TD", "PRE", "CODE", "EM", "STRONG", "B", "I", "DEL", "S", "BR", "HR", "A", "SPAN", "SUP", "SUB"]);
const DROPPED = new Set(["SCRIPT", "STYLE", "TEMPLATE", "IFRAME", "OBJECT", "EMBED", "IMG", "SVG", "MATH", "FORM"]);

function isWeb(url) { return /^https?:\/\//i.test(url || ""); }

function rebuilt(source, into) {
  for (const node of source.childNodes) {
    if (node.nodeType === Node.TEXT_NODE) into.append(node.textContent);
    if (node.nodeType !== Node.ELEMENT_NODE || DROPPED.has(node.tagName)) continue;
    if (!BLOCKS.has(node.tagName)) { rebuilt(node, into); continue; }
    const copy = document.createElement(node.tagName.toLowerCase());
    if (node.tagName === "A") {
      const href = node.getAttribute("href");
      if (!isWeb(href)) { rebuilt(node, into); continue; }
      Object.assign(copy, { href, target: "_blank", rel: "noopener noreferrer nofollow" });
    }
    const lang = (node.getAttribute("class") || "").match(/^language-[\w+#.-]+$/);
    if (node.tagName === "CODE" && lang) copy.className = lang[0];
    rebuilt(node, copy);
    into.append(copy);
  }
  return into;
}

function answerHtml(html) {
  const doc = new DOMParser().parseFromString(html || "", "text/html");
  return rebuilt(doc.body, el("div", { class: "text" }));
}

// --- a note's link, or a folder note's path -----------------------------------------------------

function noteLink(url, label, places = {}) {
  if (isWeb(url)) return el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, label);
  const place = places[url] || (url.startsWith("file://") ? decodeURIComponent(new URL(url).pathname) : url);
  return el("span", {}, label, " ", el("code", { class: "place" }, place));
}

function sourceList(citations, heading, places) {
  if (!citations.length) return null;
  return el("div", { class: "sources" }, el("p", { class: "label" }, heading),
    el("ol", {}, citations.map((c) => el("li", { "data-n": c.n },
      `[${c.n}] `, noteLink(c.url, c.heading ? `${c.title} › ${c.heading}` : c.title, places)))));
}

// --- asking ---------------------------------------------------------------------------------------

function turn(question) {
  const item = el("li", { class: "turn" }, el("p", { class: "question" }, question));
  $("log").append(item);
  return item;
}

function botSays(item, ...content) {
  const box = el("div", { class: "answer" }, ...content);
  item.append(box);
  box.scrollIntoView({ block: "end" });
  return box;
}

async function ask(question) {
  const item = turn(question);
  const reading = el("p", { class: "reading" }, "…");
  const stream = el("div", { class: "stream" });
  const box = botSays(item, reading, stream);
  try {
    const reply = await fetch("/ask", {
      method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf },
      body: JSON.stringify({ question, conversation: state.conversation, keep: true, user: state.user }),
    });
    if (reply.status === 401) throw new NeedSignin();
    if (!reply.ok) throw new Error((await reply.json().catch(() => ({}))).error || `HTTP ${reply.status}`);
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) if (line.trim()) shown(JSON.parse(line), box, reading, stream, question);
      if (done) break;
    }
  } catch (err) {
    if (err instanceof NeedSignin) return failed(err);
    box.replaceChildren(el("p", { class: "error" }, err.message));
  }
}

function shown(event, box, reading, stream, question) {
  if (event.event === "sources") {
    reading.textContent = "Reading / 正在读: " + event.sources.map((s) => s.title).join(" · ");
  } else if (event.event === "token") {
    stream.textContent += event.text; // the text as it is written: plain text until the answer is whole
    box.classList.add("streaming");
  } else if (event.event === "error") {
    box.replaceChildren(el("p", { class: "error" }, event.error));
  } else if (event.event === "answer") {
    const a = event.answer;
    const places = event.places || {};
    box.classList.remove("streaming");
    box.replaceChildren(...[answerHtml(event.html),
      ...(event.notices || [a.notice]).filter(Boolean).map((n) => el("p", { class: "notice" }, n)),
      a.citations.length ? sourceList(a.citations, "Sources / 来源", places)
        : sourceList(a.closest, "Closest notes / 最接近的笔记", places),
      event.answer_id ? buttons(event.answer_id, a, question) : null].filter(Boolean)); // (null would show as text)
  }
}

function buttons(answerId, answer, question) {
  const row = el("div", { class: "buttons" });
  const out = el("div", { class: "more" });
  const rate = (verdict) => async (event) => {
    try {
      await api(`/answers/${answerId}/feedback`, { method: "POST", body: { verdict, user: state.user } });
      row.querySelectorAll(".rate").forEach((b) => b.setAttribute("aria-pressed", String(b === event.target)));
      say("谢谢 / Thanks");
    } catch (err) { failed(err); }
  };
  row.append(...[
    el("button", { type: "button", class: "rate up", "aria-pressed": "false", onclick: rate("up") }, "👍"),
    el("button", { type: "button", class: "rate down", "aria-pressed": "false", onclick: rate("down") }, "👎"),
    el("button", { type: "button", class: "why", onclick: async () => {
      try {
        const why = await api(`/answers/${answerId}/why`);
        out.replaceChildren(el("pre", { class: "trace" }, why.text));
      } catch (err) { failed(err); }
    } }, "Why? / 依据"),
    answer.citations.length ? el("button", { type: "button", class: "save", onclick: async () => {
      try {
        out.replaceChildren(receipt(await api(`/answers/${answerId}/save`, { method: "POST" })));
      } catch (err) { failed(err); }
    } }, "Save as note / 存为笔记") : null,
    el("button", { type: "button", class: "related", onclick: async () => {
      try { out.replaceChildren(related(await api("/memory/related", { params: { target: question } }))); }
      catch (err) { failed(err); }
    } }, "Related / 相关")].filter(Boolean));
  return el("div", {}, row, out);
}

function receipt(r) {
  return el("p", { class: `receipt ${r.status}` }, r.message, " ", isWeb(r.url) ? noteLink(r.url, "open / 打开") : null);
}

function related(found) {
  if (!found.notes.length) return el("p", { class: "related-notes" }, `No related notes for “${found.title}”.`);
  return el("ol", { class: "related-notes" }, found.notes.map((n) => el("li", {},
    noteLink(n.url, n.title), n.notebook ? el("span", { class: "meta" }, ` (${n.notebook})`) : null)));
}

// --- commands typed into the box, as the bots take them ---------------------------------------

async function command(text) {
  const name = text.trim().split(/\s+/)[0];
  const arg = text.trim().slice(name.length).trim();
  const item = turn(text);
  try {
    if (name === "/why") {
      botSays(item, el("pre", { class: "trace" }, (await api("/why", { params: { conversation: state.conversation } })).text));
    } else if (name === "/gaps") {
      item.remove();
      await openGaps();
    } else if (name === "/related" && arg) {
      botSays(item, related(await api("/memory/related", { params: { target: arg } })));
    } else if (name === "/note" && arg) {
      botSays(item, receipt(await api("/note", { method: "POST", body: { text: arg, once: newId(), user: state.user } })));
    } else if (name === "/reset") {
      state.conversation = newId();
      sessionStorage.setItem("lr-conversation", state.conversation);
      botSays(item, el("p", {}, "好的，重新开始。 / Fresh start: the next question stands alone."));
    } else {
      botSays(item, el("p", { class: "error" }, `Try /why, /gaps, /related <note or question>, ` +
        "/note <text>, /reset — or just ask."));
    }
  } catch (err) {
    if (err instanceof NeedSignin) return failed(err);
    botSays(item, el("p", { class: "error" }, err.message));
  }
}

$("ask").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("q").value.trim();
  if (!text) return;
  $("q").value = "";
  say("");
  await (text.startsWith("/") ? command(text) : ask(text));
});

$("q").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});

// --- the gaps: write the note (✍️), or dismiss (✖) ----------------------------------------------

async function openGaps() {
  const gaps = await api("/gaps");
  const list = $("gap-list");
  list.replaceChildren(...gaps.map(gapItem));
  if (!gaps.length) list.append(el("li", { class: "empty" }, "None open: your notes answered everything. / 没有未解答的问题。"));
  $("gaps").hidden = false;
}

function gapItem(gap) {
  const times = gap.count === 1 ? "asked once" : `asked ${gap.count} times`;
  const item = el("li", { class: "gap", "data-id": gap.id }, el("p", { class: "question" }, gap.wordings[0]),
    el("p", { class: "meta" }, times));
  const form = el("form", { class: "gap-note", hidden: true },
    el("textarea", { rows: 4, required: true, placeholder: "The note that answers it (its title is the question)" }),
    el("button", { type: "submit" }, "Save note / 保存"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const r = await api(`/gaps/${gap.id}/note`, { method: "POST", body: { text: form.elements[0].value, user: state.user } });
      form.replaceWith(receipt(r));
    } catch (err) { failed(err); }
  });
  item.append(el("div", { class: "buttons" },
    el("button", { type: "button", class: "write", onclick: () => { form.hidden = false; form.elements[0].focus(); } }, "✍️ Write"),
    el("button", { type: "button", class: "dismiss", onclick: async () => {
      try {
        await api(`/gaps/${gap.id}/dismiss`, { method: "POST" });
        item.remove();
        say("Dismissed / 已忽略");
      } catch (err) { failed(err); }
    } }, "✖ Dismiss")), form);
  return item;
}

$("open-gaps").addEventListener("click", () => openGaps().catch(failed));

// --- capture a note (an id of its own: sent again after a lost reply, it is written once) -----------

$("open-note").addEventListener("click", () => {
  state.once = state.once || newId();
  $("capture").hidden = false;
  $("note-text").focus();
});

$("note-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.once = state.once || newId();
  try {
    const r = await api("/note", { method: "POST", body: {
      text: $("note-text").value, title: $("note-title").value.trim() || null, once: state.once, user: state.user } });
    say(r.message);
    if (r.status !== "refused") {
      $("note-form").reset();
      state.once = "";
      $("capture").hidden = true;
    }
  } catch (err) { failed(err); }
});

document.querySelectorAll("button.close").forEach((b) => b.addEventListener("click", () => {
  $(b.dataset.close).hidden = true;
}));

window.addEventListener("hashchange", () => { if (location.hash.includes("code=")) boot(); }); // a link opened here
boot();
