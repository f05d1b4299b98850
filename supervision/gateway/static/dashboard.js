// The harness dashboard: one page speaking the gateway's protocol (ACP v1 + _harness/*)
// over the websocket at /acp. No build step, no dependencies.
//
// Authentication: the token comes from the URL fragment (#token=..., never sent to the
// server) or the form, is kept only in this tab's sessionStorage, and travels as the
// browser subprotocol `harness.bearer.<base64url(token)>` next to `harness.v1`.
"use strict";

const TOKEN_KEY = "harness.token";
const ROW_HEIGHT = 28;          // px; must match --row in dashboard.css
const PAGE_LIMIT = 500;         // _harness/sessions/list page size (the gateway's maximum)
const EVENT_ROWS = 1500;        // rendered event rows kept; older ones are summarised
const REPLAY_EVENTS = 2000;     // on selection, replay at most this many recent events
const RECONNECT_MS = [500, 1000, 2000, 5000];
const RELIST_MS = 5000;         // list refresh while the gateway sends no "status" changes

// ---------------------------------------------------------------------------- helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function ratio(hit, prompt) {
  return prompt ? `${((100 * hit) / prompt).toFixed(1)}%` : "-";
}

function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id;
}

function textOf(content) {
  return (content || []).filter((b) => b.type === "text").map((b) => b.text).join("");
}

function notice(message) {
  document.getElementById("notice").textContent = message;
}

// ------------------------------------------------------------------------- JSON-RPC

class RpcError extends Error {
  constructor(error) {
    super(error.message);
    this.code = error.code;
    this.data = error.data;
  }
}

class Connection {
  constructor(url, token) {
    this.url = url;
    this.token = token;
    this.nextId = 1;
    this.pending = new Map();
    this.handlers = new Map();
    this.ws = null;
  }

  open() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url, ["harness.v1", `harness.bearer.${base64url(this.token)}`]);
      this.ws = ws;
      let opened = false;
      ws.onopen = () => { opened = true; resolve(); };
      ws.onmessage = (message) => this.receive(message.data);
      ws.onclose = (event) => {
        for (const { reject: fail } of this.pending.values()) {
          fail(new RpcError({ code: -1, message: "connection closed" }));
        }
        this.pending.clear();
        if (!opened) reject(new Error("the gateway refused the connection (check the token)"));
        else if (this.onclose) this.onclose(event);
      };
    });
  }

  receive(text) {
    let message;
    try { message = JSON.parse(text); } catch { return; }
    if (message.id != null && (message.result !== undefined || message.error !== undefined)) {
      const waiter = this.pending.get(message.id);
      if (!waiter) return;
      this.pending.delete(message.id);
      if (message.error) waiter.reject(new RpcError(message.error));
      else waiter.resolve(message.result);
      return;
    }
    const handler = this.handlers.get(message.method);
    if (handler) handler(message.params || {});
  }

  call(method, params = {}) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new RpcError({ code: -1, message: `not connected (${method})` }));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  notify(method, params = {}) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    this.ws.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
  }

  on(method, handler) {
    this.handlers.set(method, handler);
  }

  close() {
    this.onclose = null;
    if (this.ws) this.ws.close(1000);
  }
}

// ------------------------------------------------------------------------------ state

const state = {
  conn: null,
  agents: ["default"],
  sessions: new Map(),        // sessionId -> SessionSummary
  order: [],                  // flattened tree order of visible sessions
  filter: "",
  selected: null,
  subscription: null,         // log subscription of the selected session
  lastSeq: -1,
  baseSeq: -1,                // the summary's figures cover the log up to this seq
  requests: [],               // per request of the selected session: {turn, step, prompt, hit, output}
  renderQueued: false,
  eventRows: 0,
  eventsDropped: 0,
  streaming: null,            // {turn, step, node} while assistant chunks arrive
  reconnects: 0,
  pendingPrompt: false,
  statusChanges: false,       // the gateway sent a "status" change: no periodic relist needed
  relistTimer: null,
};

// ------------------------------------------------------------------------ the session list

function queueRender() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    rebuildOrder();
    renderSessions();
  });
}

function rebuildOrder() {
  const filter = state.filter.toLowerCase();
  const children = new Map();
  const roots = [];
  for (const s of state.sessions.values()) {
    const parent = s.parentSessionId;
    if (parent && state.sessions.has(parent)) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(s);
    } else {
      roots.push(s);
    }
  }
  const newest = (a, b) => (b.updatedAt || 0) - (a.updatedAt || 0) || (a.sessionId < b.sessionId ? -1 : 1);
  roots.sort(newest);
  const order = [];
  const visit = (s, depth) => {
    const text = `${s.sessionId} ${s.agent || ""} ${s.status || ""}`.toLowerCase();
    if (!filter || text.includes(filter)) order.push({ s, depth });
    for (const child of (children.get(s.sessionId) || []).sort(newest)) visit(child, depth + 1);
  };
  for (const root of roots) visit(root, 0);
  state.order = order;
  const live = [...state.sessions.values()];
  const running = live.filter((s) => s.status === "running").length;
  document.getElementById("session-count").textContent =
    `(${order.length}${filter ? ` of ${live.length}` : ""})`;
  document.getElementById("stats").textContent =
    `${live.length} sessions, ${running} running`;
}

function renderSessions() {
  const viewport = document.getElementById("session-viewport");
  const spacer = document.getElementById("session-spacer");
  spacer.style.height = `${state.order.length * ROW_HEIGHT}px`;
  const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_HEIGHT) - 5);
  const last = Math.min(state.order.length, first + Math.ceil(viewport.clientHeight / ROW_HEIGHT) + 10);
  const rows = [];
  for (let index = first; index < last; index++) {
    const { s, depth } = state.order[index];
    const usage = s.usage || { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0 };
    const row = el(
      "div",
      {
        class: `session-row row${s.sessionId === state.selected ? " selected" : ""}`,
        "data-session": s.sessionId,
        title: s.sessionId,
        onclick: () => select(s.sessionId),
      },
      el("span", { class: `c-status status ${s.status}`, text: s.status }),
      el("span", { class: "c-id" },
        depth ? el("span", { class: "child", text: `${"  ".repeat(depth - 1)}↳ ` }) : null,
        shortId(s.sessionId)),
      el("span", { class: "c-agent", text: s.agent || "-" }),
      el("span", { class: "c-turn", text: s.turn == null || s.turn < 0 ? "-" : String(s.turn) }),
      el("span", { class: "c-usage", text: `${usage.inputTokens} / ${usage.outputTokens}` }),
      el("span", { class: "c-ratio", text: ratio(usage.cacheReadTokens, usage.inputTokens) }),
    );
    row.style.top = `${index * ROW_HEIGHT}px`;
    rows.push(row);
  }
  spacer.replaceChildren(...rows);
}

function emptySummary(sessionId) {
  return { sessionId, status: "starting", turn: null, headSeq: -1,
    usage: { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0 } };
}

let relistTimer = null;

function scheduleRelist() {
  // A change notification that is not a full SessionSummary: list again, at most once a second.
  if (relistTimer !== null) return;
  relistTimer = setTimeout(async () => {
    relistTimer = null;
    try { await listSessions(); } catch (error) { notice(`listing sessions failed: ${error.message}`); }
  }, 1000);
}

function track(event) {
  // Keep the selected session's summary current from its own log.
  const s = state.sessions.get(state.selected);
  if (!s || event.seq <= (state.baseSeq ?? -1)) return;
  s.headSeq = event.seq;
  s.updatedAt = event.time;
  if (event.type === "turn/start") { s.turn = event.data.turn; s.status = "running"; }
  else if (event.type === "turn/end") s.status = "idle";
  else if (event.type === "assistant/message" && event.data.usage) {
    const u = event.data.usage;
    s.usage = { inputTokens: s.usage.inputTokens + u.input_tokens,
      outputTokens: s.usage.outputTokens + u.output_tokens,
      cacheReadTokens: s.usage.cacheReadTokens + u.cache_read_tokens };
  }
  if (["turn/start", "turn/end", "assistant/message"].includes(event.type)) {
    renderDetailHeader();
    queueRender();
  }
}

async function loadSessions() {
  const conn = state.conn;
  const watch = await conn.call("_harness/sessions/watch", {});
  const subscription = watch.subscription;
  conn.on("_harness/sessions/changed", (params) => {
    if (params.subscription !== subscription) return;
    const s = params.session;
    if (params.change === "status") state.statusChanges = true;
    if (params.change === "removed") state.sessions.delete(s.sessionId);
    else {
      state.sessions.set(s.sessionId, { ...emptySummary(s.sessionId), ...state.sessions.get(s.sessionId), ...s });
      if (s.status === undefined) scheduleRelist();
    }
    if (s.sessionId === state.selected) renderDetailHeader();
    queueRender();
  });
  await listSessions();
  // A gateway that announces status changes keeps the list current by itself; until one
  // arrives, the list is refreshed every few seconds so other sessions' status stays true.
  if (!state.relistTimer) {
    state.relistTimer = setInterval(() => {
      if (!state.statusChanges && !document.hidden && state.conn) scheduleRelist();
    }, RELIST_MS);
  }
}

async function listSessions() {
  let cursor;
  do {
    const page = await state.conn.call("_harness/sessions/list", cursor ? { cursor, limit: PAGE_LIMIT } : { limit: PAGE_LIMIT });
    for (const s of page.sessions) {
      const known = state.sessions.get(s.sessionId);
      // The selected session's figures come from its own log, which is never behind the list.
      if (!known || s.sessionId !== state.selected || (s.headSeq ?? -1) >= (known.headSeq ?? -1)) {
        state.sessions.set(s.sessionId, { ...known, ...s });
      }
    }
    cursor = page.nextCursor;
    queueRender();
  } while (cursor);
}

// ---------------------------------------------------------------------- the selected session

function renderDetailHeader() {
  const s = state.sessions.get(state.selected);
  if (!s) return;
  document.getElementById("detail-title").textContent = s.sessionId;
  const usage = s.usage || { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0 };
  document.getElementById("detail-meta").textContent =
    `agent ${s.agent || "-"} · ${s.status} · turn ${s.turn == null || s.turn < 0 ? "-" : s.turn} · ` +
    `${usage.inputTokens} in / ${usage.outputTokens} out · cache ${ratio(usage.cacheReadTokens, usage.inputTokens)}`;
  const links = document.getElementById("detail-links");
  const items = [];
  if (s.parentSessionId) {
    items.push(el("span", { text: "parent " }),
      el("a", { "data-link": s.parentSessionId, onclick: () => select(s.parentSessionId) }, shortId(s.parentSessionId)));
  }
  const kids = [...state.sessions.values()].filter((c) => c.parentSessionId === s.sessionId);
  if (kids.length) {
    items.push(el("span", { text: " children " }));
    for (const c of kids) items.push(el("a", { "data-link": c.sessionId, onclick: () => select(c.sessionId) }, shortId(c.sessionId)));
  }
  links.replaceChildren(...items);
}

async function select(sessionId) {
  if (state.selected === sessionId) return;
  const conn = state.conn;
  if (state.subscription) {
    const old = state.subscription;
    state.subscription = null;
    conn.call("_harness/log/unsubscribe", { subscription: old }).catch(() => {});
  }
  state.selected = sessionId;
  state.lastSeq = -1;
  state.requests = [];
  state.eventRows = 0;
  state.eventsDropped = 0;
  state.streaming = null;
  document.getElementById("empty-detail").hidden = true;
  document.getElementById("session-detail").hidden = false;
  document.getElementById("events").replaceChildren();
  document.getElementById("cache-break").replaceChildren();
  document.getElementById("prompt-status").textContent = "";
  renderDetailHeader();
  renderChart();
  queueRender();
  await subscribe(sessionId);
  refreshInspect();
}

async function subscribe(sessionId, fromSeq) {
  const s = state.sessions.get(sessionId);
  const head = s && typeof s.headSeq === "number" ? s.headSeq : -1;
  if (fromSeq == null) state.baseSeq = head;
  const start = fromSeq != null ? fromSeq : Math.max(0, head - REPLAY_EVENTS + 1);
  if (start > 0 && fromSeq == null) {
    document.getElementById("events").append(
      el("div", { class: "note", text: `${start} earlier events not shown (harness show ${sessionId} prints them all)` }));
  }
  try {
    const result = await state.conn.call("_harness/log/subscribe", { sessionId, fromSeq: start });
    if (state.selected !== sessionId) {
      state.conn.call("_harness/log/unsubscribe", { subscription: result.subscription }).catch(() => {});
      return;
    }
    state.subscription = result.subscription;
  } catch (error) {
    document.getElementById("events").append(el("div", { class: "note", text: `cannot follow the log: ${error.message}` }));
  }
}

function onLogEvent(params) {
  if (params.subscription !== state.subscription) return;
  const event = params.event;
  if (event.seq <= state.lastSeq) return;
  state.lastSeq = event.seq;
  track(event);
  appendEvent(event);
}

function describe(event) {
  const d = event.data;
  switch (event.type) {
    case "user/message": {
      const src = d.source || {};
      const who = src.kind === "plugin" ? `[${src.plugin}${src.form ? ` ${src.form}` : ""}] ` : "";
      return who + textOf(d.content);
    }
    case "assistant/message": {
      const u = d.usage;
      const usage = u ? ` — prompt ${u.input_tokens}, cached ${u.cache_read_tokens}, out ${u.output_tokens}` : "";
      const calls = (d.message.content || []).filter((b) => b.type === "tool-call").map((b) => b.name);
      return `${textOf(d.message.content)}${calls.length ? ` [calls ${calls.join(", ")}]` : ""}${usage}`;
    }
    case "tool/call": return `${d.name} ${d.arguments}`;
    case "tool/result": return `${d.is_error ? "ERROR " : ""}${d.content}`;
    case "turn/start": return `turn ${d.turn}`;
    case "step/start": case "step/end": return `turn ${d.turn} step ${d.step}`;
    case "request/header": return `${d.reason}: ${(d.header.tools || []).length} tools, system ${(d.header.system || "").length} chars`;
    case "request/retry": return `attempt ${d.attempt} failed (${d.failure.code}); retry in ${d.delay_ms} ms`;
    case "turn/end": {
      const r = d.reason;
      if (r.kind === "error") return `turn ${d.turn}: error — ${r.error.message}`;
      if (r.kind === "aborted") return `turn ${d.turn}: aborted (${r.reason.kind})`;
      return `turn ${d.turn}: ${r.kind}`;
    }
    default: return "";
  }
}

function appendEvent(event) {
  const box = document.getElementById("events");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  if (event.type === "assistant/chunk") {
    const chunk = event.data.chunk;
    if (chunk.type !== "text" && chunk.type !== "reasoning") return;
    const key = `${event.data.turn}/${event.data.step}`;
    if (!state.streaming || state.streaming.key !== key) {
      const body = el("span", { class: "body" });
      const row = el("div", { class: `event chunk${event.seq > state.baseSeq ? " fresh" : ""}`, "data-type": "assistant/chunk" },
        el("span", { class: "seq", text: String(event.seq) }),
        el("span", { class: "type", text: "streaming" }), body);
      state.streaming = { key, body };
      addRow(box, row, event);
    }
    state.streaming.body.textContent += chunk.text;
  } else {
    if (event.type === "assistant/message") state.streaming = null;
    const classes = event.seq > state.baseSeq ? ["event", "fresh"] : ["event"];
    if (event.type === "turn/end") {
      classes.push("turn-end");
      if (!["completed", "max-tokens"].includes(event.data.reason.kind)) classes.push("failed");
    }
    if (event.type === "tool/result" && event.data.is_error) classes.push("tool-error");
    addRow(box, el("div", { class: classes.join(" "), "data-type": event.type, "data-seq": String(event.seq) },
      el("span", { class: "seq", text: String(event.seq) }),
      el("span", { class: "type", text: event.type }),
      el("span", { class: "body", text: describe(event) })), event);
  }
  document.getElementById("event-count").textContent = `(last seq ${event.seq})`;
  if (atBottom) box.scrollTop = box.scrollHeight;
  if (event.type === "assistant/message" && event.data.usage) {
    const u = event.data.usage;
    state.requests.push({ turn: event.data.turn, step: event.data.step, prompt: u.input_tokens,
      hit: u.cache_read_tokens, output: u.output_tokens });
    renderChart();
  }
  if (event.type === "turn/end") refreshInspect();
}

function addRow(box, row, event) {
  row.dataset.time = String(event.time);          // when the event was appended (epoch ms)
  row.dataset.received = String(Date.now());      // when this page showed it
  box.append(row);
  state.eventRows++;
  if (state.eventRows > EVENT_ROWS) {
    const first = box.querySelector(".event");
    if (first) first.remove();
    state.eventRows--;
    state.eventsDropped++;
    let note = box.querySelector(".note.dropped");
    if (!note) { note = el("div", { class: "note dropped" }); box.prepend(note); }
    note.textContent = `${state.eventsDropped} older events scrolled out of view (harness show prints them all)`;
  }
}

// ------------------------------------------------------------------------------ the chart

function limits(requests) {
  // The most a prefix cache can serve: what the previous request sent (and got back).
  return requests.map((r, i) => (i === 0 ? 0 : Math.min(r.prompt, requests[i - 1].prompt + requests[i - 1].output)));
}

function renderChart() {
  const chart = document.getElementById("cache-chart");
  const requests = state.requests;
  const width = chart.clientWidth || 400;
  const height = 170;
  const pad = { left: 40, right: 6, top: 8, bottom: 18 };
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.replaceChildren();
  const prompt = requests.reduce((a, r) => a + r.prompt, 0);
  const hit = requests.reduce((a, r) => a + r.hit, 0);
  const bound = limits(requests);
  const limitTotal = bound.reduce((a, b) => a + b, 0);
  document.getElementById("cache-summary").textContent = requests.length
    ? `${requests.length} requests · hit ratio ${ratio(hit, prompt)} · physical limit ${ratio(limitTotal, prompt)} · click a bar for its prefix report`
    : "no model requests yet";
  if (!requests.length) return;
  const top = Math.max(...requests.map((r) => r.prompt), 1);
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const slot = plotW / requests.length;
  const barW = Math.max(1, Math.min(28, slot * 0.8));
  const y = (v) => pad.top + plotH - (v / top) * plotH;
  chart.append(svg("line", { x1: pad.left, y1: pad.top + plotH, x2: width - pad.right, y2: pad.top + plotH, stroke: "#ccd" }));
  const label = svg("text", { x: 2, y: pad.top + 8 });
  label.textContent = String(top);
  chart.append(label);
  const zero = svg("text", { x: 2, y: pad.top + plotH });
  zero.textContent = "0";
  chart.append(zero);
  requests.forEach((r, i) => {
    const x = pad.left + i * slot + (slot - barW) / 2;
    const group = svg("g", { class: "req", "data-index": i });
    const title = svg("title");
    title.textContent = `turn ${r.turn} step ${r.step}: prompt ${r.prompt}, cache hit ${r.hit} (${ratio(r.hit, r.prompt)}), limit ${bound[i]}`;
    group.append(title,
      svg("rect", { class: "bar-prompt", x, y: y(r.prompt), width: barW, height: y(0) - y(r.prompt) }),
      svg("rect", { class: "bar-hit", x, y: y(r.hit), width: barW, height: y(0) - y(r.hit) }),
      svg("line", { class: "limit", x1: x - 1, x2: x + barW + 1, y1: y(bound[i]), y2: y(bound[i]) }));
    group.addEventListener("click", () => showBreak(i));
    chart.append(group);
  });
}

// The same lane analysis as `harness cache`: canonical compact JSON, byte offsets, lanes.
function spans(request) {
  const enc = new TextEncoder();
  const parts = [];
  let offset = 0;
  const add = (text, lane, index, label) => {
    const size = enc.encode(text).length;
    parts.push({ start: offset, end: offset + size, lane, index, label, text });
    offset += size;
  };
  const source = (m) => {
    const s = m.source;
    if (!s) return m.role;
    if (s.kind === "tool") return `${m.role} (tool result ${s.call_id})`;
    if (s.kind === "plugin") return `${m.role} (plugin ${s.plugin}${s.form ? ` ${s.form}` : ""})`;
    return `${m.role} (${s.kind})`;
  };
  add(`{"config":${JSON.stringify(request.config)}`, "config");
  if ("system" in request) add(`,"system":${JSON.stringify(request.system)}`, "system");
  if (request.tools) {
    request.tools.forEach((t, i) => add(`${i ? "," : ',"tools":['}${JSON.stringify(t)}`, "tool", i, t.name));
    add("]", "tool", request.tools.length - 1, request.tools.length ? request.tools[request.tools.length - 1].name : null);
  }
  const messages = request.messages;
  add(',"messages":[', "message", 0, messages.length ? source(messages[0]) : null);
  messages.forEach((m, i) => add(`${i ? "," : ""}${JSON.stringify(m)}`, "message", i, source(m)));
  add("]}", "end");
  const bytes = enc.encode(parts.map((p) => p.text).join(""));
  return { bytes, parts };
}

function findBreak(previous, current) {
  const a = spans(previous);
  const b = spans(current);
  const n = Math.min(a.bytes.length, b.bytes.length);
  let common = 0;
  while (common < n && a.bytes[common] === b.bytes[common]) common++;
  if (common >= a.bytes.length - 2) return { common: a.bytes.length - 2, brk: null };
  const at = (parts) => parts.find((p) => p.start <= common && common < p.end) || parts[parts.length - 1];
  const rank = { config: 0, system: 1, tool: 2, message: 3, end: 4 };
  const first = at(a.parts);
  const second = at(b.parts);
  const span = rank[first.lane] < rank[second.lane] ? first : second;
  const lane = span.lane === "end" ? "message" : span.lane;
  if (lane === "message") {
    const m = [second, first].find((p) => p.lane === "message") || span;
    return { common, brk: { offset: common, lane, messageIndex: m.index, messageSource: m.label } };
  }
  if (lane === "tool") return { common, brk: { offset: common, lane, tool: span.label } };
  return { common, brk: { offset: common, lane } };
}

async function showBreak(index) {
  const box = document.getElementById("cache-break");
  const r = state.requests[index];
  const sessionId = state.selected;
  document.querySelectorAll("#cache-chart .req").forEach((g) => g.classList.toggle("chosen", Number(g.dataset.index) === index));
  const head = `request ${index} (turn ${r.turn} step ${r.step}): prompt ${r.prompt}, cache hit ${r.hit} (${ratio(r.hit, r.prompt)})`;
  if (index === 0) {
    box.replaceChildren(el("div", { text: `${head} — the first request: nothing to reuse yet.` }));
    return;
  }
  box.replaceChildren(el("div", { text: `${head} — comparing with the previous request…` }));
  try {
    const p = state.requests[index - 1];
    const [before, after] = await Promise.all([
      state.conn.call("_harness/request/rebuild", { sessionId, turn: p.turn, step: p.step, attempt: -1 }),
      state.conn.call("_harness/request/rebuild", { sessionId, turn: r.turn, step: r.step, attempt: -1 }),
    ]);
    const { common, brk } = findBreak(before.request, after.request);
    let line;
    if (!brk) line = el("div", { text: `only appended to the previous request (${common} bytes kept)` });
    else {
      const where = brk.lane === "tool" ? `tool ${JSON.stringify(brk.tool)}`
        : brk.lane === "message" ? `message ${brk.messageIndex} (${brk.messageSource})`
          : brk.lane === "system" ? "system text" : "config";
      line = el("div", { class: "break", text: `prefix BREAK at byte ${brk.offset}: ${where}` });
    }
    box.replaceChildren(el("div", { text: head }), line,
      el("div", { class: "mono", text: `harness cache ${sessionId}   # the whole report` }));
  } catch (error) {
    box.replaceChildren(el("div", { text: `${head} — cannot rebuild: ${error.message}` }));
  }
}

// ---------------------------------------------------------------------------- inspect

async function refreshInspect() {
  const sessionId = state.selected;
  const box = document.getElementById("inspect");
  if (!sessionId) return;
  try {
    const result = await state.conn.call("_harness/prompt/inspect", { sessionId });
    if (state.selected !== sessionId) return;
    renderInspect(result);
  } catch (error) {
    if (state.selected !== sessionId) return;
    const note = el("div", { class: "note", text: `inspect unavailable: ${error.message}` });
    if (error.data && error.data.reason === "not_running") {
      const resume = el("button", { type: "button", id: "resume-button", text: "Resume session",
        onclick: async () => {
          try {
            await state.conn.call("session/resume", { sessionId, cwd: "/" });
            refreshInspect();
          } catch (failure) {
            note.textContent = `resume failed: ${failure.message}`;
          }
        } });
      box.replaceChildren(note, resume);
    } else {
      box.replaceChildren(note);
    }
  }
}

function renderInspect(result) {
  const box = document.getElementById("inspect");
  const scopeCell = (scope) => el("td", { class: scope === "global" ? "" : "scope-agent", text: scope });
  const sections = el("table", { id: "inspect-sections" },
    el("tr", {}, el("th", { text: "order" }), el("th", { text: "section" }), el("th", { text: "scope" }), el("th", { text: "bytes" })));
  for (const s of result.sections) {
    sections.append(el("tr", { "data-section": s.name },
      el("td", { class: "num", text: s.order == null ? "-" : String(s.order) }),
      el("td", { text: s.name + (s.complete ? " (complete)" : "") }),
      scopeCell(s.scope + (s.shadows && s.shadows.length ? ` (shadows ${s.shadows.join(", ")})` : "")),
      el("td", { class: "num", text: String(s.bytes) })));
  }
  const tools = el("table", { id: "inspect-tools" },
    el("tr", {}, el("th", { text: "#" }), el("th", { text: "tool" }), el("th", { text: "scope" })));
  result.tools.forEach((t, i) => tools.append(el("tr", { "data-tool": t.name },
    el("td", { class: "num", text: String(i) }), el("td", { text: t.name }), scopeCell(t.scope))));
  const contexts = el("div", { id: "inspect-contexts" });
  if (!result.contexts.length) contexts.append(el("div", { class: "note", text: "no runtime contexts" }));
  for (const c of result.contexts) {
    contexts.append(el("div", {}, el("strong", { text: `${c.name} ` }), el("span", { text: `(${c.scope})` })),
      el("pre", { text: c.text }));
  }
  const vars = Object.entries(result.variables || {}).map(([k, v]) => `${k}=${v == null ? "(none)" : v}`).join(", ");
  box.replaceChildren(
    el("div", { text: result.headerChanged ? "the next request logs a new header" : "the next request reuses the logged header" }),
    sections, tools, contexts, el("div", { class: "note", text: `variables: ${vars}` }));
}

// -------------------------------------------------------------------------- controls

function promptStatus(text, isError = false) {
  const node = document.getElementById("prompt-status");
  node.textContent = text;
  node.classList.toggle("error", isError);
}

async function sendPrompt(event) {
  event.preventDefault();
  const input = document.getElementById("prompt-input");
  const text = input.value.trim();
  const sessionId = state.selected;
  if (!text || !sessionId) return;
  input.value = "";
  promptStatus("turn running…");
  try {
    const result = await state.conn.call("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
    if (state.selected === sessionId) promptStatus(`turn ended: ${result.stopReason}`);
  } catch (error) {
    const reason = error.data && error.data.turnEnd ? ` (${JSON.stringify(error.data.turnEnd)})` : "";
    if (state.selected === sessionId) promptStatus(`prompt failed: ${error.message}${reason}`, true);
  }
}

async function steer() {
  const input = document.getElementById("prompt-input");
  const text = input.value.trim();
  if (!text || !state.selected) return;
  input.value = "";
  try {
    await state.conn.call("_harness/session/send", {
      sessionId: state.selected, content: [{ type: "text", text }], placement: "next_step" });
    promptStatus("steering message queued for the next step");
  } catch (error) {
    promptStatus(`steer failed: ${error.message}`, true);
  }
}

async function cancelTurn() {
  if (!state.selected) return;
  try {
    const result = await state.conn.call("_harness/session/cancel", { sessionId: state.selected, keepInbox: true });
    promptStatus(result.cancelled ? "cancel requested" : "no turn was running");
  } catch (error) {
    promptStatus(`cancel failed: ${error.message}`, true);
  }
}

async function newSession(event) {
  event.preventDefault();
  const agent = document.getElementById("new-agent").value.trim() || "default";
  try {
    const result = await state.conn.call("session/new", { cwd: "/", mcpServers: [], _meta: { harness: { agent } } });
    notice(`started session ${shortId(result.sessionId)}`);
    state.sessions.set(result.sessionId, { ...emptySummary(result.sessionId), agent, status: "idle",
      ...state.sessions.get(result.sessionId) });
    queueRender();
    select(result.sessionId);
  } catch (error) {
    notice(`new session failed: ${error.message}`);
  }
}

// ------------------------------------------------------------------------- connecting

function setConnection(text, stateName) {
  const node = document.getElementById("connection");
  node.textContent = text;
  node.dataset.state = stateName;
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("app").hidden = true;
  document.getElementById("login-error").textContent = message || "";
}

async function connect(token) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const conn = new Connection(`${scheme}://${location.host}/acp`, token);
  setConnection("connecting…", "idle");
  try {
    await conn.open();
  } catch (error) {
    setConnection("not connected", "closed");
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(error.message);
    return;
  }
  state.conn = conn;
  state.reconnects = 0;
  conn.on("_harness/log/event", onLogEvent);
  conn.onclose = (event) => {
    state.lastClose = `${event.code} ${event.reason}`;
    setConnection(`disconnected (${event.code}${event.reason ? ` ${event.reason}` : ""}); reconnecting…`, "closed");
    const delay = RECONNECT_MS[Math.min(state.reconnects++, RECONNECT_MS.length - 1)];
    setTimeout(() => reconnect(token), delay);
  };
  try {
    const init = await conn.call("initialize", {
      protocolVersion: 1, clientCapabilities: {}, clientInfo: { name: "harness-dashboard", version: "1" } });
    const meta = (((init.agentCapabilities || {})._meta || {}).harness) || {};
    if (Array.isArray(meta.agents) && meta.agents.length) state.agents = meta.agents;
    setConnection(`connected${meta.runtimeId ? ` · ${meta.runtimeId}` : ""}`, "open");
    document.getElementById("login").hidden = true;
    document.getElementById("app").hidden = false;
    document.getElementById("agent-names").replaceChildren(...state.agents.map((a) => el("option", { value: a })));
    await loadSessions();
    if (state.selected) {
      const sessionId = state.selected;
      await subscribe(sessionId, state.lastSeq + 1);
    }
  } catch (error) {
    notice(`gateway error: ${error.message}`);
  }
}

function reconnect(token) {
  // The selection stays; `connect` resubscribes it from the next seq, so nothing is lost.
  state.subscription = null;
  connect(token);
}

function takeToken() {
  const match = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function start() {
  document.getElementById("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    document.getElementById("token-input").value = "";
    connect(token);
  });
  document.getElementById("session-viewport").addEventListener("scroll", () => renderSessions(), { passive: true });
  window.addEventListener("resize", () => { renderSessions(); renderChart(); });
  document.getElementById("session-filter").addEventListener("input", (event) => {
    state.filter = event.target.value;
    queueRender();
  });
  document.getElementById("prompt-form").addEventListener("submit", sendPrompt);
  document.getElementById("steer-button").addEventListener("click", steer);
  document.getElementById("cancel-button").addEventListener("click", cancelTurn);
  document.getElementById("new-session-form").addEventListener("submit", newSession);
  document.getElementById("inspect-refresh").addEventListener("click", refreshInspect);
  const token = takeToken();
  if (token) connect(token);
  else showLogin();
}

start();
