// Shared by every page: the key (entered once, kept in sessionStorage), authorized fetch,
// a tiny element builder and formatters. Everything shown comes from the JSON API, so a
// key sees its own project's objects and nothing else.

const KEY = "mathrl.key";

export class AuthError extends Error {}
export class NotFound extends Error {}

export const getKey = () => sessionStorage.getItem(KEY);
export const setKey = (k) => sessionStorage.setItem(KEY, k.trim());
export const clearKey = () => sessionStorage.removeItem(KEY);

function urlFor(path, params = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  return url;
}

const auth = () => ({ Authorization: `Bearer ${getKey()}` });

// A refused request as an error: 401 -> AuthError, 404 -> NotFound, else Error(the problem's detail).
async function failure(r) {
  let detail = `${r.status} ${r.statusText}`;
  try { detail = (await r.json()).detail || detail; } catch { /* not JSON */ }
  if (r.status === 401) return new AuthError(detail);
  if (r.status === 404) return new NotFound(detail);
  return new Error(detail);
}

// GET /v1/... with the key; JSON back.
export async function api(path, params = {}) {
  const r = await fetch(urlFor(path, params), { headers: { ...auth(), Accept: "application/json" } });
  if (r.ok) return r.json();
  throw await failure(r);
}

// POST /v1/... with the key and a JSON body (headers: e.g. Idempotency-Key); JSON back.
export async function post(path, body = null, headers = {}) {
  const r = await fetch(urlFor(path), {
    method: "POST",
    headers: { ...auth(), Accept: "application/json", "Content-Type": "application/json", ...headers },
    body: body === null ? null : JSON.stringify(body),
  });
  if (r.ok) return r.json();
  throw await failure(r);
}

// Follows a Server-Sent-Events route until the server ends it: onMessage(type, data) per message.
// Read with fetch, not EventSource: an EventSource cannot send the Authorization header, and the
// key must not travel in the URL (logs, history). Throws like api() when the stream is refused.
export async function follow(path, params, onMessage, { signal, onOpen } = {}) {
  const r = await fetch(urlFor(path, params), { headers: { ...auth(), Accept: "text/event-stream" }, signal });
  if (!r.ok) throw await failure(r);
  onOpen?.();
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }  // ":" lines are keep-alives; "id:" is the event's seq, which the data carries too
      if (data.length) onMessage(type, JSON.parse(data.join("\n")));
    }
  }
}

// Every page of a cursor-paginated list.
export async function apiAll(path, params = {}, max = 20) {
  const out = [];
  let cursor;
  for (let i = 0; i < max; i++) {
    const page = await api(path, { ...params, cursor });
    out.push(...page.data);
    if (!page.next_cursor) break;
    cursor = page.next_cursor;
  }
  return out;
}

// h("a", {href: "/x", class: "y"}, "text", child, ...): text is always set as text, never parsed.
// SVG tags are known by name; "svg:a" makes an SVG element of an HTML-looking name.
const SVG_TAGS = new Set(["svg", "g", "path", "rect", "line", "text", "circle", "polyline", "title", "defs", "marker"]);
export function h(tag, attrs = {}, ...children) {
  const svg = SVG_TAGS.has(tag) || tag.startsWith("svg:");
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag.replace(/^svg:/, "")) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const $ = (sel, root = document) => root.querySelector(sel);

// the job statuses, terminal ones and moves as the server defines them (mathrl/status.py), from the page shell
const STATUS = JSON.parse(document.getElementById("mathrl-status").textContent);
export const STATUSES = STATUS.statuses;
export const TERMINAL = new Set(STATUS.terminal);
export const KINDS = STATUS.kinds;
export const badge = (status) => h("span", { class: `badge ${status}`, "data-status": status }, status);
// ids are UUIDv7: the first digits are a timestamp shared by jobs made together, the last are random
export const shortId = (id) => (id ? id.slice(-8) : "");

export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function fmtDuration(startIso, endIso) {
  if (!startIso) return "";
  const s = Math.max(0, ((endIso ? new Date(endIso) : new Date()) - new Date(startIso)) / 1000);
  if (s < 60) return `${s.toFixed(0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.round((s % 3600) / 60)}m`;
}

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "";
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return Number(v.toPrecision(3)).toExponential();
  return String(Number(v.toPrecision(digits)));
}

export const pct = (v) => (v === null || v === undefined ? "" : `${(100 * v).toFixed(1)}%`);

// Calls fn every `ms` until it returns false; errors are shown and polling goes on.
export function every(ms, fn) {
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    let again = true;
    try { again = (await fn()) !== false; } catch (e) { if (e instanceof AuthError) { showKeyForm(e.message); return; } console.error(e); }
    if (again && !stopped) setTimeout(tick, ms);
  };
  setTimeout(tick, ms);
  return () => { stopped = true; };
}

function showWho() {
  const who = $("#who");
  who.replaceChildren();
  const k = getKey();
  if (!k) return;
  who.append(`key ${k.slice(0, 10)}…`, h("button", { type: "button", onclick: () => { clearKey(); location.reload(); } }, "forget key"));
}

export function showKeyForm(message) {
  clearKey();
  showWho();
  const input = h("input", { name: "key", type: "password", placeholder: "mrl_…", autocomplete: "off", required: true, autofocus: true });
  const form = h("form", { class: "keyform card", id: "keyform" },
    h("h1", {}, "Enter your API key"),
    message ? h("p", { class: "notice error" }, message) : null,
    h("p", { class: "muted" }, "The key stays in this browser tab (sessionStorage) and is sent as ",
      h("code", {}, "Authorization: Bearer"), " to this server's API. Create one with ", h("code", {}, "mathrl-server keys create"), "."),
    input,
    h("button", { class: "primary", type: "submit" }, "Continue"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); setKey(input.value); location.reload(); });
  $("#main").replaceChildren(form);
}

// Page entry: needs a key, then render(main). A refused key brings the form back.
export async function boot(render) {
  const page = document.body.dataset.page;
  const navName = page === "job" ? "jobs" : page === "pipeline" ? "pipelines" : page;
  document.querySelector(`nav a[data-nav="${navName}"]`)?.classList.add("active");
  if (!getKey()) { showKeyForm(); return; }
  showWho();
  const main = $("#main");
  try {
    await render(main);
  } catch (e) {
    if (e instanceof AuthError) showKeyForm(`The server refused this key: ${e.message}`);
    else if (e instanceof NotFound) main.replaceChildren(h("p", { class: "notice", id: "notfound" }, `Not found: ${e.message}`));
    else { console.error(e); main.replaceChildren(h("p", { class: "notice error" }, `Error: ${e.message}`)); }
  }
}
