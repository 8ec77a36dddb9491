// The release service's page: datasets a token may see, their budgets and releases, and the
// per-class marginal densities of each release drawn from its signed artifact alone.
"use strict";

const TOKEN_KEY = "klrelease-token";
const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#7F7F7F",
  "#8C564B", "#17BECF", "#BCBD22"];
const SVG = "http://www.w3.org/2000/svg";
const artifacts = new Map(); // "dataset/request_id" -> artifact JSON
const opened = new Set(); // plots the reader opened or closed by hand: "dataset/request_id"
const closed = new Set();

const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path, options = {}) {
  const headers = Object.assign({ "Accept": "application/json" }, options.headers || {});
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  const res = await fetch(path, Object.assign({}, options, { headers }));
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (res.status === 401 && t) {
    signOut("Your token is no longer valid: sign in again.");
  }
  return { status: res.status, body };
}

function fmt(x) {
  if (x === null || x === undefined) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-3 && a < 1e5) return String(Number(x.toPrecision(4)));
  return x.toExponential(2).replace(/\.?0+e/, "e").replace("e+", "e");
}

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function newRequestId() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// ------------------------------------------------------------------------- sign in / out

function showSignIn(message) {
  $("sign-in").hidden = false;
  $("datasets").hidden = true;
  $("who").hidden = true;
  $("sign-in-error").textContent = message || "";
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  $("datasets").replaceChildren();
  showSignIn(message);
}

async function signIn(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  const me = await api("/v1/me");
  if (me.status !== 200) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("sign-in-error").textContent = me.status === 401
      ? "This token is not valid." : "The service did not answer (" + me.status + ").";
    return;
  }
  $("token").value = "";
  await showDatasets(me.body);
}

// ------------------------------------------------------------------------------ datasets

async function showDatasets(me) {
  $("sign-in").hidden = true;
  $("who").hidden = false;
  $("who-name").textContent = me.name + " (" + me.role + ")";
  const box = $("datasets");
  box.hidden = false;
  const list = await api("/v1/datasets");
  if (list.status !== 200) return;
  box.replaceChildren();
  if (list.body.datasets.length === 0) {
    box.append(el("p", { class: "card muted" }, "This token is granted no dataset."));
  }
  for (const ds of list.body.datasets) {
    const card = $("dataset-template").content.firstElementChild.cloneNode(true);
    card.dataset.name = ds.name;
    card.setAttribute("data-testid", "dataset-" + ds.name);
    box.append(card);
    card.querySelector(".release-form").addEventListener("submit",
      (e) => release(e, ds.name, card));
    await refresh(card, ds.name, true);
  }
}

async function refresh(card, name, withMechanisms) {
  const [info, rels] = await Promise.all([
    api("/v1/datasets/" + encodeURIComponent(name)),
    api("/v1/datasets/" + encodeURIComponent(name) + "/releases"),
  ]);
  if (info.status !== 200 || rels.status !== 200) return;
  const ds = info.body;
  card.querySelector(".ds-name").textContent = ds.name;
  card.querySelector(".ds-meta").textContent =
    ds.adjacency + " adjacency · " + ds.classes.length + " classes (" +
    ds.classes.join(", ") + ") · " + ds.n_features + " features" +
    (ds.max_epsilon_per_request ? " · at most ε = " + fmt(ds.max_epsilon_per_request) +
      " per request" : "");
  gauge(card, ds.budget);
  if (withMechanisms) {
    const select = card.querySelector("select[name=mechanism]");
    select.replaceChildren(...ds.mechanisms.map((m) => el("option", { value: m.name,
      title: m.summary }, m.name)));
  }
  await releases(card, name, rels.body.releases);
}

function gauge(card, budget) {
  const frac = Math.max(0, Math.min(1, budget.spent.fraction));
  const svg = card.querySelector(".gauge");
  const pct = Math.round(frac * 1000) / 10;
  svg.querySelector(".fill").setAttribute("stroke-dasharray", (frac * 100) + " 100");
  svg.querySelector(".fill").style.visibility = frac > 0 ? "visible" : "hidden";
  svg.querySelector(".pct").textContent = pct + "%";
  svg.classList.toggle("warn", frac >= 0.6 && frac < 0.9);
  svg.classList.toggle("bad", frac >= 0.9);
  svg.setAttribute("aria-valuenow", String(pct));
  svg.setAttribute("data-testid", "gauge");
  svg.setAttribute("data-fraction", String(budget.spent.fraction));
  const words = card.querySelector(".budget-words");
  words.replaceChildren(
    document.createTextNode("budget ε = " + fmt(budget.total.epsilon) + ", δ = " +
      fmt(budget.total.delta)),
    el("br"),
    document.createTextNode(budget.releases + " release" + (budget.releases === 1 ? "" : "s") +
      " · " + budget.spent.accounting));
}

// ------------------------------------------------------------------------------ releases

async function releases(card, name, list) {
  const body = card.querySelector("table.releases tbody");
  body.replaceChildren();
  card.querySelector(".empty").hidden = list.length > 0;
  card.querySelector("table.releases").hidden = list.length === 0;
  const newest = list.find((r) => r.state === "released");
  for (const r of list) {
    const key = name + "/" + r.request_id;
    const row = el("tr", { class: "release", "data-request-id": r.request_id });
    const when = new Date(r.created_at * 1000);
    row.append(
      el("td", { title: when.toISOString() }, when.toLocaleString()),
      el("td", {}, r.who || "–"),
      el("td", {}, r.mechanism),
    );
    const g = el("td", { title: r.statement });
    g.append(document.createTextNode("ε " + fmt(r.epsilon) + " · δ " + fmt(r.delta) + " · " +
      r.adjacency + " · "), el("span", { class: "cert" }, "certified"));
    row.append(g);
    const st = el("td");
    st.append(el("span", { class: "state " + r.state }, r.state.replaceAll("_", " ")));
    row.append(st);
    body.append(row);
    if (r.state !== "released") continue;
    const plotRow = el("tr", { class: "plot-row" });
    const cell = el("td", { colspan: "5" });
    plotRow.append(cell);
    body.append(plotRow);
    const show = opened.has(key) || (r === newest && !closed.has(key));
    plotRow.hidden = !show;
    if (show) await plot(cell, name, r.request_id);
    row.addEventListener("click", async () => {
      plotRow.hidden = !plotRow.hidden;
      (plotRow.hidden ? closed : opened).add(key);
      (plotRow.hidden ? opened : closed).delete(key);
      if (!plotRow.hidden && !cell.firstChild) await plot(cell, name, r.request_id);
    });
  }
}

async function plot(cell, name, requestId) {
  const key = name + "/" + requestId;
  let art = artifacts.get(key);
  if (!art) {
    const res = await api("/v1/datasets/" + encodeURIComponent(name) + "/releases/" +
      encodeURIComponent(requestId));
    if (res.status !== 200) {
      cell.replaceChildren(el("p", { class: "error" }, (res.body && res.body.detail) ||
        "the artifact could not be read"));
      return;
    }
    art = res.body;
    artifacts.set(key, art);
  }
  cell.replaceChildren(marginals(art));
}

// Per-class marginal densities p(x_j, y = k) = w_k N(x_j; mean_kj, cov_kjj), from the artifact.
function marginals(art) {
  const box = el("div", { class: "marginals", "data-testid": "marginals" });
  if (!art.gmm) {
    box.append(el("p", { class: "muted" }, "FAIL at stage " + (art.stage || "?") + ": " +
      (art.reason || "no model released")));
    return box;
  }
  const g = art.gmm;
  const K = g.weights.length;
  const d = g.means[0].length;
  const names = (art.feature_names && art.feature_names.length === d) ? art.feature_names
    : Array.from({ length: d }, (_, j) => "x" + j);
  const classes = g.classes && g.classes.length === K ? g.classes
    : Array.from({ length: K }, (_, k) => String(k));
  const legend = el("div", { class: "legend" });
  classes.forEach((c, k) => {
    const item = el("span");
    const sw = el("span", { class: "swatch" });
    sw.style.background = COLOURS[k % COLOURS.length];
    item.append(sw, document.createTextNode(String(c) + " (weight " +
      g.weights[k].toFixed(3) + ")"));
    legend.append(item);
  });
  box.append(legend);
  const grid = el("div", { class: "plots" });
  for (let j = 0; j < d; j++) grid.append(panel(g, j, names[j]));
  box.append(grid);
  box.append(el("p", { class: "plot-note muted" }, "Drawn from the released weights, means " +
    "and covariances (" + art.mechanism + ", ε = " + fmt(art.privacy.epsilon) + ", δ = " +
    fmt(art.privacy.delta) + "); signed by key " +
    (art.signature ? art.signature.key_id : "–") + "."));
  return box;
}

function panel(g, j, name) {
  const W = 218, H = 120, L = 8, R = 8, T = 6, B = 20;
  const K = g.weights.length;
  const sd = g.covariances.map((c) => Math.sqrt(Math.max(c[j][j], 1e-300)));
  let lo = Infinity, hi = -Infinity;
  for (let k = 0; k < K; k++) {
    lo = Math.min(lo, g.means[k][j] - 3.5 * sd[k]);
    hi = Math.max(hi, g.means[k][j] + 3.5 * sd[k]);
  }
  const n = 160;
  const xs = Array.from({ length: n }, (_, i) => lo + (hi - lo) * i / (n - 1));
  const ys = [];
  let top = 0;
  for (let k = 0; k < K; k++) {
    const c = g.weights[k] / (sd[k] * Math.sqrt(2 * Math.PI));
    const row = xs.map((x) => c * Math.exp(-0.5 * ((x - g.means[k][j]) / sd[k]) ** 2));
    top = Math.max(top, ...row);
    ys.push(row);
  }
  const px = (x) => L + (x - lo) / (hi - lo) * (W - L - R);
  const py = (y) => H - B - (top > 0 ? y / top : 0) * (H - B - T);
  const wrap = el("div", { class: "plot" });
  wrap.append(el("p", { class: "title" }, name));
  const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
    "aria-label": "marginal densities of " + name });
  for (let k = 0; k < K; k++) {
    const colour = COLOURS[k % COLOURS.length];
    let d = "M" + px(xs[0]).toFixed(1) + " " + py(0).toFixed(1);
    for (let i = 0; i < n; i++) d += " L" + px(xs[i]).toFixed(1) + " " + py(ys[k][i]).toFixed(1);
    d += " L" + px(xs[n - 1]).toFixed(1) + " " + py(0).toFixed(1) + " Z";
    svg.append(svgEl("path", { d, class: "curve", fill: colour, stroke: colour }));
  }
  svg.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  [lo, (lo + hi) / 2, hi].forEach((v, i) => {
    const t = svgEl("text", { x: px(v), y: H - 6, class: "tick",
      "text-anchor": ["start", "middle", "end"][i] });
    t.textContent = fmt(v);
    svg.append(t);
  });
  wrap.append(svg);
  return wrap;
}

// ------------------------------------------------------------------------------- release

async function release(event, name, card) {
  event.preventDefault();
  const form = event.target;
  const status = form.querySelector(".form-status");
  const button = form.querySelector("button");
  const epsilon = Number(form.epsilon.value);
  const delta = Number(form.delta.value);
  status.className = "form-status";
  if (!(epsilon > 0) || !(delta > 0 && delta < 1)) {
    status.classList.add("error");
    status.textContent = "ε must be > 0 and δ in (0, 1).";
    return;
  }
  button.disabled = true;
  status.textContent = "releasing…";
  const res = await api("/v1/datasets/" + encodeURIComponent(name) + "/releases", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ mechanism: form.mechanism.value, epsilon, delta,
      request_id: newRequestId() }),
  });
  button.disabled = false;
  if (res.status === 201 || res.status === 200) {
    status.classList.add("ok");
    status.textContent = "released: ε = " + fmt(epsilon) + ", δ = " + fmt(delta) + ".";
  } else {
    status.classList.add("error");
    status.textContent = (res.body && res.body.detail) || ("error " + res.status);
  }
  await refresh(card, name, false);
}

// ---------------------------------------------------------------------------------- start

async function start() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut(""));
  const key = await api("/v1/key");
  if (key.status === 200) $("key-id").textContent = key.body.key_id;
  if (!token()) { showSignIn(); return; }
  const me = await api("/v1/me");
  if (me.status === 200) await showDatasets(me.body);
  else showSignIn(me.status === 401 ? "" : "The service did not answer.");
}

document.addEventListener("DOMContentLoaded", start);
