// The dashboard's page (GET /dashboard): every KV block of every tier as a cell, the sequences holding blocks, the
// request queues and plots of the last minutes, drawn from the frames that /dashboard/ws pushes about twice a second
// (their shape: http/dashboard.h). The figures are also in the DOM as data-value attributes (ids below), for tests.
"use strict";

const CELL_FREE = 0, CELL_CACHED = 1, CELL_SHARED = 2, CELL_BUSY = 3, CELL_FIRST_SEQ = 4;  // model/kv/kv_snapshot.h
const HISTORY_MS = 5 * 60 * 1000;  // what the plots show
const FIXED_COLOURS = { [CELL_FREE]: "#2a3039", [CELL_CACHED]: "#4f6d8a", [CELL_SHARED]: "#f5f5f5", [CELL_BUSY]: "#ff9800" };

// The colour of a cell byte: a fixed one, or a hue per sequence (golden-angle steps, so neighbours differ).
function cellColour(cell) {
  if (cell < CELL_FIRST_SEQ) return FIXED_COLOURS[cell];
  return `hsl(${(((cell - CELL_FIRST_SEQ) * 137.508) % 360).toFixed(1)}, 65%, 58%)`;
}
// The cell byte of a block that sequence `id` holds alone (seq_cell in model/kv/kv_snapshot.cpp).
function seqCell(id) { return CELL_FIRST_SEQ + (id % (256 - CELL_FIRST_SEQ)); }

// Free, cached and in-use blocks of a tier, counted from its runs [cell, count, ...].
function countTier(tier) {
  let free = 0, cached = 0;
  for (let i = 0; i < tier.runs.length; i += 2) {
    if (tier.runs[i] === CELL_FREE) free += tier.runs[i + 1];
    else if (tier.runs[i] === CELL_CACHED) cached += tier.runs[i + 1];
  }
  return { free, cached, inUse: tier.blocks - free - cached };
}

// Sets a figure's text and its data-value.
function setFigure(id, value, text) {
  const el = document.getElementById(id);
  el.dataset.value = String(value);
  el.textContent = text ?? String(value);
}

// ---- the block grids -------------------------------------------------------------------------------------------

const TIER_TITLES = { device: "Device pool", swap: "CPU swap space", cpu: "CPU tier (prefix cache)", disk: "Disk tier" };

// The canvas of one replica's tier, created on first use.
function tierCanvas(key, title) {
  let box = document.getElementById(`tier-${key}`);
  if (!box) {
    box = document.createElement("div");
    box.className = "tier";
    box.id = `tier-${key}`;
    box.innerHTML = "<h3></h3><canvas></canvas>";
    document.getElementById("tiers").appendChild(box);
  }
  box.querySelector("h3").innerHTML = title;
  box.dataset.seen = "1";
  return box.querySelector("canvas");
}

// Draws a tier's runs: cells of s CSS pixels, k blocks per cell when the tier has more blocks than fit maxHeight.
function drawTier(canvas, tier) {
  const width = canvas.clientWidth || 300;
  const maxHeight = tier.name === "device" ? 420 : 140;
  const blocks = Math.max(1, tier.blocks);
  const s = Math.max(1, Math.min(16, Math.floor(Math.sqrt((width * maxHeight) / blocks))));
  const cols = Math.max(1, Math.floor(width / s));
  const k = Math.max(1, Math.ceil(blocks / (cols * Math.max(1, Math.floor(maxHeight / s)))));
  const rows = Math.ceil(Math.ceil(blocks / k) / cols);
  const dpr = window.devicePixelRatio || 1;
  canvas.style.height = `${rows * s}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(rows * s * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, rows * s);
  const gap = s >= 5 ? 1 : 0;
  let pos = 0;
  for (let i = 0; i < tier.runs.length; i += 2) {
    const cell = tier.runs[i], count = tier.runs[i + 1];
    const first = Math.floor(pos / k), last = Math.floor((pos + count - 1) / k);
    pos += count;
    ctx.fillStyle = cellColour(cell);
    if (gap) {
      for (let c = first; c <= last; c++) {
        const x = (c % cols) * s, y = Math.floor(c / cols) * s;
        ctx.fillRect(x, y, s - gap, s - gap);
        if (cell === CELL_SHARED && s >= 7) {  // shared blocks carry a dark centre
          ctx.fillStyle = "#111";
          ctx.fillRect(x + s / 2 - 2, y + s / 2 - 2, 3, 3);
          ctx.fillStyle = cellColour(cell);
        }
      }
    } else {
      for (let c = first; c <= last;) {  // one rectangle per row the run covers
        const col = c % cols, n = Math.min(last - c + 1, cols - col);
        ctx.fillRect(col * s, Math.floor(c / cols) * s, n * s, s);
        c += n;
      }
    }
  }
}

// ---- the plots -------------------------------------------------------------------------------------------------

const PLOTS = [
  { key: "throughput", title: "Throughput", unit: "tok/s", digits: 0 },
  { key: "ttft", title: "TTFT (mean)", unit: "ms", digits: 1 },
  { key: "tpot", title: "TPOT (mean)", unit: "ms", digits: 2 },
  { key: "kv", title: "KV usage", unit: "%", digits: 1, max: 100 },
  { key: "preemptions", title: "Preemptions", unit: "/s", digits: 1 },
  { key: "hit", title: "Prefix hit rate", unit: "%", digits: 1, max: 100 },
];
const history = [];  // {t, throughput, ttft, tpot, kv, preemptions, hit}; a value is null where nothing happened
let previous = null; // the last frame's time and totals

function setUpPlots() {
  const box = document.getElementById("plots");
  for (const p of PLOTS) {
    const div = document.createElement("div");
    div.className = "plot";
    div.innerHTML = `<div class="title"><span>${p.title}</span><b id="plot-${p.key}">–</b></div><canvas></canvas>`;
    box.appendChild(div);
    p.canvas = div.querySelector("canvas");
  }
}

// One history point from the totals' change since the previous frame.
function recordPoint(frame, kvUsage) {
  const t = frame.time_ms, totals = frame.totals;
  if (previous && t > previous.t) {
    const dt = (t - previous.t) / 1000, d = (name) => totals[name] - previous.totals[name];
    history.push({
      t,
      throughput: d("generation_tokens") / dt,
      ttft: d("ttft_count") > 0 ? (1000 * d("ttft_sum")) / d("ttft_count") : null,
      tpot: d("tpot_count") > 0 ? (1000 * d("tpot_sum")) / d("tpot_count") : null,
      kv: kvUsage,
      preemptions: d("preemptions") / dt,
      hit: d("prompt_tokens") > 0 ? (100 * d("prefix_hit_tokens")) / d("prompt_tokens") : null,
    });
    while (history.length && history[0].t < t - HISTORY_MS) history.shift();
  }
  previous = { t, totals };
}

function drawPlot(p) {
  const canvas = p.canvas, width = canvas.clientWidth || 240, height = canvas.clientHeight || 70;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const points = history.filter((h) => h[p.key] !== null);
  const last = points.length ? points[points.length - 1][p.key] : null;
  document.getElementById(`plot-${p.key}`).textContent = last === null ? "–" : `${last.toFixed(p.digits)} ${p.unit}`;
  if (!points.length) return;
  const max = p.max ?? Math.max(1e-9, ...points.map((h) => h[p.key])) * 1.15;
  const now = history[history.length - 1].t;
  const span = Math.min(HISTORY_MS, Math.max(60 * 1000, now - history[0].t));  // a minute at least, five at most
  ctx.strokeStyle = "#6cb6ff";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach((h, i) => {
    const x = width - ((now - h.t) / span) * width, y = height - 2 - (h[p.key] / max) * (height - 4);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

// ---- one frame -------------------------------------------------------------------------------------------------

let lastFrame = null;

function render(frame) {
  let inUse = 0, cached = 0, free = 0, total = 0;
  for (const el of document.querySelectorAll(".tier")) el.dataset.seen = "";
  const queues = [];
  for (const r of frame.replicas) {
    for (const tier of r.tiers) {
      const counts = countTier(tier);
      if (tier.name === "device") {
        inUse += counts.inUse;
        cached += counts.cached;
        free += counts.free;
        total += tier.blocks;
      }
      const where = frame.replicas.length > 1 ? ` · replica ${r.index} (${r.address})` : "";
      const title = `${TIER_TITLES[tier.name] ?? tier.name}${where} <small>${tier.blocks} blocks · ${counts.inUse} ` +
                    `in use · ${counts.cached} cached · ${counts.free} free</small>`;
      drawTier(tierCanvas(`${r.index}-${tier.name}`, title), tier);
    }
    for (const [id, swapped, blocks, computed] of r.seqs) {
      queues.push(`<span class="seq"><i class="swatch" style="background:${cellColour(seqCell(id))}"></i>` +
                  `#${id} ${swapped ? "swapped" : "device"} · ${blocks} blocks · ${computed} tokens</span>`);
    }
  }
  for (const el of document.querySelectorAll(".tier")) if (!el.dataset.seen) el.remove();
  document.getElementById("queues").innerHTML = queues.length ? queues.join("") : "none";
  setFigure("running-requests", frame.queues.running);
  setFigure("waiting-requests", frame.queues.waiting);
  setFigure("swapped-requests", frame.queues.swapped);
  setFigure("blocks-in-use", inUse, `${inUse} / ${total}`);
  setFigure("blocks-cached", cached);
  setFigure("blocks-free", free);
  recordPoint(frame, total ? (100 * inUse) / total : 0);
  for (const p of PLOTS) drawPlot(p);
  setFigure("update-seq", frame.seq);
  document.body.dataset.timeMs = String(frame.time_ms);
  document.body.dataset.receivedMs = String(Date.now());
}

// ---- the connection --------------------------------------------------------------------------------------------

function connect() {
  const badge = document.getElementById("connection");
  // The key, when the page was opened with ?key=KEY, goes along (the server also set it as a cookie).
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/dashboard/ws${location.search}`);
  ws.onopen = () => { badge.dataset.state = "live"; badge.textContent = "live"; };
  ws.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (frame.type !== "snapshot") return;
    lastFrame = frame;
    render(frame);
  };
  ws.onclose = () => {
    badge.dataset.state = "closed";
    badge.textContent = "reconnecting";
    setTimeout(connect, 1000);
  };
}

setUpPlots();
window.addEventListener("resize", () => { if (lastFrame) render(lastFrame); });  // the same frame adds no point
connect();
