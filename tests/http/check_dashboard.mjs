// The dashboard (GET /dashboard) in headless Chromium, driven over the DevTools protocol: without the key the page,
// its files and its WebSocket are refused; with ?key= the page goes live under a few streaming requests, a screenshot
// is written, and the figures the page shows (blocks in use, cached, free; running requests: data-value attributes)
// agree with /metrics: under load with the reads just before and after a frame, at rest exactly.
// Usage: node check_dashboard.mjs --base http://127.0.0.1:PORT --key KEY --devtools http://127.0.0.1:PORT
//        --screenshot FILE.png
import { writeFileSync } from "node:fs";
import WebSocket from "ws";
import { check, checkEqual, finish, metrics, parseArgs, sleep, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const PUSH_MS = 500;  // DashboardSession::kPushInterval
await waitForHealth(base);

// ---- refusals without the key ----------------------------------------------------------------------------------

for (const path of ["/dashboard", "/dashboard/dashboard.js", "/dashboard?key=wrong"]) {
  const r = await fetch(`${base}${path}`);
  checkEqual(r.status, 401, `${path} without the key: 401`);
}
const page = await fetch(`${base}/dashboard?key=${encodeURIComponent(args.key)}`);
checkEqual(page.status, 200, "/dashboard?key=KEY: 200");
const cookie = (page.headers.get("set-cookie") ?? "").split(";")[0];
check(cookie.startsWith("paged_key="), "the page sets the key's cookie", page.headers.get("set-cookie"));
checkEqual((await fetch(`${base}/dashboard/dashboard.js`, { headers: { cookie } })).status, 200, "the script with the cookie");
checkEqual((await fetch(`${base}/dashboard`, { headers: { authorization: `Bearer ${args.key}` } })).status, 200,
           "the page with the Authorization header");
checkEqual((await fetch(`${base}/dashboard/nothing.js`, { headers: { cookie } })).status, 404, "an unknown file: 404");
checkEqual((await fetch(`${base}/dashboard/ws`, { headers: { cookie } })).status, 400, "/dashboard/ws without upgrade: 400");
checkEqual((await fetch(`${base}/dashboard`, { method: "POST", headers: { cookie } })).status, 405, "POST /dashboard: 405");

// The WebSocket's answer: the status of a refused upgrade, or the first frame.
function wsFirst(url, headers = {}) {
  return new Promise((resolve) => {
    const ws = new WebSocket(url, { headers });
    ws.once("unexpected-response", (req, res) => { resolve({ status: res.statusCode }); req.destroy(); });
    ws.once("message", (data) => { resolve({ frame: JSON.parse(data.toString()) }); ws.close(); });
    ws.once("error", (e) => resolve({ error: String(e) }));
  });
}
const wsBase = `${base.replace(/^http/, "ws")}/dashboard/ws`;
checkEqual((await wsFirst(wsBase)).status, 401, "the WebSocket without the key: 401");
checkEqual((await wsFirst(`${wsBase}?key=wrong`)).status, 401, "the WebSocket with a wrong key: 401");
const viaCookie = await wsFirst(wsBase, { cookie });
checkEqual(viaCookie.frame?.type, "snapshot", "the WebSocket with the cookie pushes snapshots");
checkEqual(viaCookie.frame?.replicas?.[0]?.tiers?.[0]?.name, "device", "its first tier is the device pool");

// ---- a DevTools client -----------------------------------------------------------------------------------------

const targets = await (await fetch(`${args.devtools}/json/list`)).json();
const target = targets.find((t) => t.type === "page");
const cdp = new WebSocket(target.webSocketDebuggerUrl, { perMessageDeflate: false });
await new Promise((resolve, reject) => { cdp.once("open", resolve); cdp.once("error", reject); });
let nextId = 1;
const pending = new Map();
const loaded = [];
cdp.on("message", (data) => {
  const msg = JSON.parse(data.toString());
  if (msg.id && pending.has(msg.id)) {
    const { resolve, reject } = pending.get(msg.id);
    pending.delete(msg.id);
    if (msg.error) reject(new Error(`${msg.error.message}`)); else resolve(msg.result);
  } else if (msg.method === "Page.loadEventFired") {
    loaded.push(Date.now());
  }
});
const send = (method, params = {}) => new Promise((resolve, reject) => {
  const id = nextId++;
  pending.set(id, { resolve, reject });
  cdp.send(JSON.stringify({ id, method, params }));
});
// The page's figures, as its DOM holds them.
async function pageFigures() {
  const r = await send("Runtime.evaluate", {
    returnByValue: true,
    expression: `(() => {
      const v = (id) => document.getElementById(id)?.dataset.value ?? "";
      return { seq: Number(v("update-seq")), timeMs: Number(document.body.dataset.timeMs ?? 0),
               inUse: v("blocks-in-use"), cached: v("blocks-cached"), free: v("blocks-free"),
               running: v("running-requests"), state: document.getElementById("connection")?.dataset.state,
               tiers: document.querySelectorAll(".tier canvas").length };
    })()`,
  });
  const f = r.result.value;
  return { ...f, inUse: Number(f.inUse), cached: Number(f.cached), free: Number(f.free), running: Number(f.running) };
}
// What /metrics says of the same figures.
async function metricFigures() {
  const m = await metrics(base);
  return { inUse: m.paged_kv_blocks_total - m.paged_kv_blocks_free,
           cached: m.paged_kv_blocks_cached, free: m.paged_kv_blocks_free - m.paged_kv_blocks_cached,
           running: m.paged_num_requests_running };
}

await send("Page.enable");
await send("Emulation.setDeviceMetricsOverride", { width: 1280, height: 900, deviceScaleFactor: 1, mobile: false });
await send("Page.navigate", { url: `${base}/dashboard?key=${encodeURIComponent(args.key)}` });
for (let i = 0; i < 100 && !loaded.length; i++) await sleep(100);
check(loaded.length > 0, "the page loaded");
let first = await pageFigures();
for (let i = 0; i < 50 && !(first.seq > 0); i++) { await sleep(100); first = await pageFigures(); }
check(first.seq > 0, "the page received a frame", first);
checkEqual(first.state, "live", "the page's socket is live");

// ---- under load ------------------------------------------------------------------------------------------------

const SHARED_PROMPT = "Once upon a time there was a little girl named Lily. She loved to play outside in the park " +
                      "with her friends. One day, she saw a big red ball under a tree and";
let loading = true;
let finishedRequests = 0;
const sends = [], ends = [];  // when the clients sent a request, and when its response had ended
async function client(i) {
  while (loading) {
    sends.push(Date.now());
    const r = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${args.key}` },
      // A prompt of a few blocks that every request shares (prefix caching: shared cells on the page).
      body: JSON.stringify({ prompt: SHARED_PROMPT, max_tokens: 400 + 30 * i,
                             temperature: 0.8, ignore_eos: true, stream: true }),
    });
    const text = await r.text();
    ends.push(Date.now());
    if (!check(r.ok, "a streaming request of the load succeeds", text.slice(0, 300))) break;
    finishedRequests++;
    await sleep(150 + 100 * i);  // quiet spells between requests, however fast the machine decodes
  }
}
// Two clients: few requests start or end (each runs a few hundred ms, then a pause), so that many frames fall
// between two.
const clients = [0, 1].map(client);
const samples = [];   // /metrics, every ~15 ms: {t0, t1 (the fetch's start and end), f (figures)}
const updates = [];   // the page, each new frame: {timeMs, figures}
const loadStart = Date.now();
const sampler = (async () => {
  while (loading) {
    const t0 = Date.now();
    const f = await metricFigures();
    samples.push({ t0, t1: Date.now(), f });
    await sleep(10);
  }
})();
// A frame built at T is judged against the last /metrics read before it and the first after it, when no request
// started or ended between the two (the server admits a request after its client sent it, within EVENT_MS, and ends
// it before its client saw the end). Between such reads the running requests do not change and the blocks in use
// only grow (each sequence takes blocks as it decodes; 256 blocks hold the two without preemption), so the page
// must show exactly the reads' running count and blocks in use between theirs.
const EVENT_MS = 50, FRAME_MS = 20;  // a frame's snapshot is taken at most FRAME_MS before its time_ms
function judgeable() {
  const judged = [];
  for (const u of updates) {
    const before = samples.filter((s) => s.t1 < u.timeMs - FRAME_MS).at(-1);
    const after = samples.find((s) => s.t0 > u.timeMs);
    if (!before || !after) continue;
    const quiet = !sends.some((t) => t >= before.t0 - EVENT_MS && t <= after.t1) &&
                  !ends.some((t) => t >= before.t0 && t <= after.t1 + EVENT_MS);
    if (quiet) judged.push({ u, before, after });
  }
  return judged;
}
const JUDGED = 6;  // frames to judge: the load runs 10 s, longer (up to 40 s) until that many fell in quiet spells
let shot = null;
for (let elapsed = 0; elapsed < 10000 || (elapsed < 40000 && judgeable().length < JUDGED);
     elapsed = Date.now() - loadStart) {
  const f = await pageFigures();
  if (!updates.length || f.seq !== updates[updates.length - 1].seq) updates.push(f);
  if (!shot && Date.now() - loadStart > 4000 && f.running > 0) {
    shot = await send("Page.captureScreenshot", { format: "png" });
    writeFileSync(args.screenshot, Buffer.from(shot.data, "base64"));
    console.log(`dashboard screenshot: ${args.screenshot}`);
  }
  await sleep(60);
}
loading = false;
await Promise.all([...clients, sampler]);
check(shot !== null, "a screenshot was taken under load");

const seconds = (updates[updates.length - 1].timeMs - updates[0].timeMs) / 1000;
const rate = (updates.length - 1) / seconds;
check(updates.length >= 8 && rate > 0.8 && rate < 3.5, "the page is updated about twice a second, no faster",
      { updates: updates.length, seconds, rate });
check(updates.some((u) => u.running > 0 && u.inUse > 0), "the page showed the load", updates.slice(-3));
check(finishedRequests >= 2, "the streaming requests finished", finishedRequests);
const judged = judgeable();
for (const { u, before, after } of judged) {
  check(before.f.running === after.f.running && u.running === before.f.running,
        "under load, the page's running requests equal /metrics' around its frame",
        { page: u.running, before: before.f.running, after: after.f.running, seq: u.seq });
  check(u.inUse >= before.f.inUse && u.inUse <= after.f.inUse,
        "under load, the page's blocks in use lie between /metrics' just before and just after its frame",
        { page: u.inUse, before: before.f.inUse, after: after.f.inUse, seq: u.seq });
}
const agreed = judged.length;
console.log(`frames judged against the /metrics reads around them: ${agreed} of ${updates.length}`);
check(agreed >= JUDGED, "enough frames fell between requests' starts and ends", { agreed, frames: updates.length });

// ---- at rest: the same numbers exactly -------------------------------------------------------------------------

let rest = null;
for (let i = 0; i < 20 && !rest; i++) {
  // /metrics unchanged over two frames' time, nothing running: the page's newest frame shows that state.
  const before = await metricFigures();
  await sleep(2 * PUSH_MS + 100);
  const p = await pageFigures();
  const after = await metricFigures();
  if (JSON.stringify(before) === JSON.stringify(after) && after.running === 0) rest = { page: p, metrics: after };
}
check(rest !== null, "the server came to rest");
if (rest) {
  for (const key of ["inUse", "cached", "free", "running"])
    checkEqual(rest.page[key], rest.metrics[key], `at rest, the page's ${key} equals /metrics'`);
  check(rest.metrics.cached > 0, "the finished prompts' blocks stay cached (shown as such)", rest.metrics);
  checkEqual(rest.page.tiers, 2, "two tiers drawn: the device pool and the swap space");
}

// A phone-sized window: the same page, narrower, still draws its tiers.
await send("Emulation.setDeviceMetricsOverride", { width: 390, height: 844, deviceScaleFactor: 2, mobile: true });
await sleep(2 * PUSH_MS);
const phone = await send("Runtime.evaluate", {
  returnByValue: true,
  expression: `(() => { const c = document.querySelector(".tier canvas"); return { width: c.clientWidth,
                 scroll: document.documentElement.scrollWidth }; })()`,
});
check(phone.result.value.width > 200 && phone.result.value.scroll <= 400, "on a phone the grid fits the width",
      phone.result.value);
cdp.close();
finish("check_dashboard");
