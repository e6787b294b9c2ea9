// The live transcript page (live.html): follows one session's Server-Sent Events.
//
// The token is typed into the form and kept in this tab's sessionStorage; it
// travels only in the Authorization header and is never written into the
// URL, whose fragment holds only the session id (#session=<id>). An old link
// that still carries #token= has it dropped from the address, unused.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "turnlog-token";
const RETRY_MS = 1000;
const SESSIONS_PAGE = 100; // the API's largest page of sessions
const CUTOFF_EVENT = "stream.cutoff"; // the API ends a stream with it when this page reads too slowly
const ERASED_EVENT = "session.erased"; // the API ends a stream with it when the session is forgotten
const view = {
  seen: [],          // seqs received in this page, in order (tests read it)
  connections: 0,    // streams opened (1 + reconnects)
  chunks: 0,         // network chunks read from the current stream (tests pace a server by it)
  cutoffs: 0,        // streams the API ended because this page fell behind
  lastEventId: null, // the resume point sent on reconnect
  ended: false,
  erased: false,     // the session was forgotten: nothing of it stays on the page
};
window.turnlog = view;
let controller = null;
let nextCursor = null;

function fragment() { return new URLSearchParams(location.hash.slice(1)); }
function showFragment(params) {
  const text = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (text ? "#" + text : ""));
}
function token() { return (sessionStorage.getItem(TOKEN_KEY) || "").trim(); }
function setState(state, text) { $("state").dataset.state = state; $("state").textContent = text || state; }

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: "Bearer " + token() }, referrerPolicy: "no-referrer" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

async function loadSessions(more) {
  const picker = $("session");
  const wanted = picker.value || fragment().get("session") || "";
  const query = new URLSearchParams({ limit: String(SESSIONS_PAGE) });
  if (more && nextCursor) query.set("cursor", nextCursor);
  const { sessions, next_cursor } = await api("/api/sessions?" + query);
  if (!more) picker.replaceChildren(new Option("pick a session…", ""));
  for (const s of sessions) {
    if (![...picker.options].some((o) => o.value === s.id)) picker.add(new Option(`${s.id} (${s.status})`, s.id));
  }
  nextCursor = next_cursor;
  $("more").hidden = !nextCursor;
  if (wanted && ![...picker.options].some((o) => o.value === wanted)) picker.add(new Option(wanted, wanted));
  picker.value = wanted;
}

function renderTurn(event) {
  const id = "turn-" + event.turn_index;
  let node = document.getElementById(id);
  if (!node) {
    node = document.createElement("div");
    node.id = id;
    node.className = "turn";
    node.dataset.turnIndex = event.turn_index;
    node.innerHTML = '<div class="who"><span class="speaker"></span><span class="cut" hidden>cut off</span></div><div class="text"></div>';
    // Keep turn order even if a turn's first event is not the newest index.
    const after = [...$("turns").children].find((n) => Number(n.dataset.turnIndex) > event.turn_index);
    $("turns").insertBefore(node, after || null);
  }
  node.dataset.status = event.type === "turn.completed" ? "complete" : "partial";
  // A completed turn the other speaker cut short (barge-in) holds the words actually spoken.
  const cut = event.type === "turn.completed" && event.barged_in === true;
  node.dataset.bargedIn = String(cut);
  node.querySelector(".cut").hidden = !cut;
  node.querySelector(".who .speaker").textContent = event.speaker;
  node.querySelector(".text").textContent = event.text; // a partial carries the whole text so far
}

function apply(seq, type, data) {
  view.seen.push(seq);
  view.lastEventId = String(seq);
  const event = JSON.parse(data);
  if (type === "session.started") {
    $("meta").textContent = `fleet ${event.fleet} · agent ${event.agent_id} · started ${event.started_at}`;
  } else if (type === "turn.partial" || type === "turn.completed") {
    renderTurn(event);
  } else if (type === "session.ended") {
    for (const n of $("turns").querySelectorAll('.turn[data-status="partial"]')) n.dataset.status = "interrupted";
    $("meta").textContent += ` · ended (${event.reason}) ${event.ended_at}`;
    view.ended = true;
  }
}

// The session was forgotten (a session.erased event, or 410 Gone): wipe what the page shows of it.
function forget() {
  $("turns").replaceChildren();
  $("meta").textContent = "";
  view.erased = true;
  view.ended = true;
}

// The text/event-stream format, fed one network chunk at a time. A line ends at
// "\r\n", "\n" or "\r"; a chunk may end between the "\r" and the "\n" of one
// line end, so a trailing "\r" waits for the next chunk before its line counts.
function eventParser(onEvent) {
  let buffer = "";
  let id = null, type = "message", data = [];
  function line(text) {
    if (text === "") { // a blank line ends the event
      if (data.length) onEvent(id, type, data.join("\n"));
      id = null; type = "message"; data = [];
      return;
    }
    if (text.startsWith(":")) return; // a comment (the keep-alive)
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    const value = colon < 0 ? "" : text.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
  return function push(chunk) {
    buffer += chunk;
    let start = 0;
    for (let i = 0; i < buffer.length; i++) {
      const c = buffer[i];
      if (c === "\n") {
        line(buffer.slice(start, i));
        start = i + 1;
      } else if (c === "\r") {
        if (i + 1 === buffer.length) break; // "\r" last: is it "\r\n"? the next chunk tells
        line(buffer.slice(start, i));
        if (buffer[i + 1] === "\n") i += 1;
        start = i + 1;
      }
    }
    buffer = buffer.slice(start);
  };
}

// One SSE stream over fetch (EventSource cannot send an Authorization header).
async function stream(sessionId, signal) {
  const headers = { Authorization: "Bearer " + token(), Accept: "text/event-stream" };
  if (view.lastEventId !== null) headers["Last-Event-ID"] = view.lastEventId;
  const response = await fetch(`/api/sessions/${encodeURIComponent(sessionId)}/events`,
                               { headers, signal, referrerPolicy: "no-referrer" });
  if (response.status === 204) { view.ended = true; return; } // resumed at the end: nothing will follow
  if (response.status === 410) { forget(); return; } // forgotten: never reconnect
  if (response.status === 401 || response.status === 404) throw Object.assign(new Error("HTTP " + response.status), { fatal: true });
  if (!response.ok) throw new Error("HTTP " + response.status);
  view.connections += 1;
  view.chunks = 0;
  setState("live");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const push = eventParser((id, type, data) => {
    if (type === CUTOFF_EVENT) { view.cutoffs += 1; return; } // the stream ends next; reconnect from lastEventId
    if (type === ERASED_EVENT) { forget(); return; }
    if (id === null || view.ended) return;
    const seq = Number(id);
    if (view.lastEventId !== null && seq <= Number(view.lastEventId)) return; // never apply twice
    apply(seq, type, data);
  });
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    view.chunks += 1;
    push(value);
    if (view.ended) { reader.cancel().catch(() => {}); return; }
  }
}

async function follow(sessionId) {
  if (controller) controller.abort();
  controller = new AbortController();
  const { signal } = controller;
  Object.assign(view, { seen: [], connections: 0, chunks: 0, cutoffs: 0, lastEventId: null, ended: false, erased: false });
  $("turns").replaceChildren();
  $("meta").textContent = "";
  showFragment(new URLSearchParams({ session: sessionId }));
  while (!signal.aborted && !view.ended) {
    try {
      await stream(sessionId, signal);
    } catch (error) {
      if (signal.aborted) return;
      if (error.fatal) { setState("error", error.message); return; }
    }
    if (view.ended || signal.aborted) break;
    setState("reconnecting"); // dropped or cut off: resume after the last seq seen
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
  if (view.ended && !signal.aborted) setState(view.erased ? "erased" : "ended"); // (aborted: another session owns the view now)
}

function start() {
  const params = fragment();
  if (params.has("token")) { params.delete("token"); showFragment(params); } // never kept in the address
  const report = (e) => setState("error", e.message);
  $("token").value = token();
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    loadSessions(false).catch(report).finally(() => {
      const wanted = fragment().get("session");
      if (wanted && !controller) follow(wanted);
    });
  });
  $("refresh").addEventListener("click", () => loadSessions(false).catch(report));
  $("more").addEventListener("click", () => loadSessions(true).catch(report));
  $("session").addEventListener("change", () => { if ($("session").value) follow($("session").value); });
  if (token()) {
    loadSessions(false).catch(report).finally(() => {
      const wanted = params.get("session");
      if (wanted) follow(wanted);
    });
  }
}

start();
