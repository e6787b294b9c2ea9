// The operations page (ops.html): polls /api/ops and renders its figures.
//
// The token is typed into the form and kept in this tab's sessionStorage (the
// same key as the live page); it travels only in the Authorization header.
// The API reads Kafka, the store and Prometheus at most once per its refresh
// interval whatever the number of pages polling, so polling costs it little.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "turnlog-token";
const POLL_MS = 2000;
const view = {
  polls: 0,        // answers rendered (tests read it)
  last: null,      // the last /api/ops answer
  error: null,     // the last failure, as text
};
window.turnlogOps = view;
let timer = null;
let generation = 0; // a new token starts a new poll loop; an older loop's answer is dropped

function token() { return (sessionStorage.getItem(TOKEN_KEY) || "").trim(); }
function setState(state, text) { $("state").dataset.state = state; $("state").textContent = text || state; }

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return Math.round(value * 1000) + " ms";
  if (value < 120) return value.toFixed(value < 10 ? 2 : 1) + " s";
  return (value / 60).toFixed(1) + " min";
}
function number(value) { return value === null || value === undefined ? "–" : String(value); }
function describe(state) {
  return {
    ok: "", pending: "(reading…)", not_configured: "(not configured)",
    timeout: "(no answer in time)", unavailable: "(unavailable)",
  }[state] || "(" + state + ")";
}

// Rows of text cells into a table's body; `empty` when there is none.
function fill(tableId, rows, empty, decorate) {
  const body = $(tableId).querySelector("tbody");
  const columns = $(tableId).querySelectorAll("thead th").length;
  const nodes = rows.map((cells, i) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = cell;
      if (typeof cell === "number" || /^[0-9.–]/.test(cell)) td.className = "num";
      tr.appendChild(td);
    }
    if (decorate) decorate(tr, i);
    return tr;
  });
  if (!nodes.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = columns;
    td.className = "empty";
    td.textContent = empty;
    tr.appendChild(td);
    nodes.push(tr);
  }
  body.replaceChildren(...nodes);
}

function source(id, state) {
  $(id).dataset.state = state;
  $(id).textContent = describe(state);
}

function render(ops) {
  view.last = ops;
  const lag = ops.lag, throughput = ops.throughput, prom = ops.prometheus;
  source("lag-state", lag.state);
  const unreadGroups = lag.unread_groups || [];
  if (unreadGroups.length) $("lag-state").textContent += ` · not read: ${unreadGroups.join(", ")}`;
  fill("lag", lag.partitions.map((p) => [p.group, p.topic, String(p.partition), number(p.committed), String(p.end),
                                         String(p.records), seconds(p.seconds)]),
       lag.state === "ok" ? "no consumer group has offsets yet" : describe(lag.state),
       (tr, i) => {
         const p = lag.partitions[i];
         tr.dataset.group = p.group; tr.dataset.topic = p.topic; tr.dataset.partition = p.partition;
         tr.dataset.records = p.records;
         tr.dataset.behind = String(p.records > 0);
       });
  source("throughput-state", throughput.state);
  fill("throughput", throughput.topics.map((t) => [t.topic, String(t.end_offsets),
                                                   t.records_per_second === null ? "measuring…" : t.records_per_second.toFixed(1)]),
       describe(throughput.state));

  $("sessions-open").textContent = number(ops.sessions_open.count);
  const ready = prom.state === "ok";
  const tts = ready ? prom.turn_to_store_seconds : { p50: null, p99: null };
  $("tts-p50").textContent = seconds(tts.p50);
  $("tts-p99").textContent = seconds(tts.p99);
  $("tile-p50").dataset.value = tts.p50 === null ? "" : String(tts.p50);
  $("tile-p99").dataset.value = tts.p99 === null ? "" : String(tts.p99);
  const degraded = ready ? prom.degraded_recorders : { count: null, instances: [] };
  $("degraded-count").textContent = number(degraded.count);
  $("tile-degraded").dataset.alert = String((degraded.count || 0) > 0);
  $("prometheus-state").dataset.state = prom.state;
  $("prometheus-state").textContent = ready
    ? `Prometheus figures over the last ${prom.window}` + (prom.turns_stored_per_second === null ? "" : ` · ${prom.turns_stored_per_second.toFixed(1)} turns stored/s`)
    : "Prometheus " + describe(prom.state) + (prom.state === "not_configured" ? ": set TURNLOG_OPS_PROMETHEUS_URL" : "");
  const why = ready ? "none" : describe(prom.state);
  fill("dlq", ready ? prom.dlq_last_hour.map((d) => [d.stage, d.reason, String(Math.round(d.records))]) : [], why);
  fill("degraded", degraded.instances.map((d) => [d.instance, d.job]), why);
  fill("spool", ready ? prom.spool_fullness.map((s) => [s.instance, s.job, Math.round(s.fullness * 100) + " %"]) : [], why);

  const age = lag.age_seconds;
  $("updated").textContent = "at " + ops.generated_at + (age ? ` · lag read ${age.toFixed(1)} s before` : "");
  view.polls += 1;
  view.error = null;
  // Lag not read (pending, timing out, unavailable) or read over three refresh intervals ago: stale.
  const unread = lag.state !== "ok" && lag.state !== "not_configured";
  const stale = unread || (age !== null && age > 3 * ops.refresh_seconds);
  setState(stale ? "stale" : "live");
}

async function poll(loop) {
  timer = null;
  try {
    const response = await fetch("/api/ops", { headers: { Authorization: "Bearer " + token() }, referrerPolicy: "no-referrer", cache: "no-store" });
    if (loop !== generation) return;
    if (response.status === 401 || response.status === 403) {
      view.error = "HTTP " + response.status;
      setState("error", view.error + (response.status === 403 ? ": needs a token for every fleet" : ""));
      return; // a refused token stays refused: wait for another one
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    const ops = await response.json();
    if (loop !== generation) return;
    render(ops);
  } catch (error) {
    if (loop !== generation) return;
    view.error = error.message;
    setState("error", error.message);
  }
  timer = setTimeout(() => poll(loop), POLL_MS);
}

function restart() {
  if (timer !== null) clearTimeout(timer);
  generation += 1;
  poll(generation);
}

function start() {
  $("token").value = token();
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    restart();
  });
  if (token()) restart();
}

start();
