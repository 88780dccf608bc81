// A head with two replicas, each a CPU `paged worker` of stories260K over mutual TLS, in real processes on loopback,
// driven by the official openai client:
// - the golden greedy continuations through the head; both replicas get requests;
// - 16 seeded streams run; the worker serving the most is SIGKILLed: every stream still finishes, its text equal to
//   what an in-process server gives for the same request, and the blocks of the replica left all come back;
// - /health lists the lost replica and stays 200; the worker restarted on its port is routed to again (the other is
//   killed to prove it: the golden prompts still come back right);
// - with both gone /health answers 503 and a completion 503.
// Usage: node check_replicas.mjs --paged PATH/TO/paged --model DIR --golden FILE --work DIR
import { spawn, spawnSync } from "node:child_process";
import OpenAI from "openai";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, metrics, parseArgs, sleep, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const golden = goldenContinuations(args.golden, args.model);  // each case's `text`: the prompt's continuation
const certs = `${args.work}/certs`;
const children = [];
process.on("exit", () => children.forEach((c) => c.kill("SIGKILL")));

/// Starts `paged ARGS`, resolves with the process and the first port its output names after `pattern`.
function start(name, argv, pattern) {
  const child = spawn(args.paged, argv, { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let output = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not report its port: ${output}`)), 30000);
    const scan = (data) => {
      output += data;
      const m = output.match(pattern);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]), output: () => output });
      }
    };
    child.stdout.on("data", scan);
    child.stderr.on("data", scan);
    child.on("exit", (code) => reject(new Error(`${name} exited with ${code}: ${output}`)));
  });
}
const startWorker = (port = 0) =>
  start("worker", ["worker", "--model", args.model, "--device", "cpu", "--port", String(port), "--tls-dir", certs],
    /listening on 127\.0\.0\.1:(\d+)/);
const startServer = (extra) =>
  start("server", ["serve", "--model", args.model, "--port", "0", ...extra], /http:\/\/127\.0\.0\.1:(\d+)/);
async function kill(proc) {
  const exited = new Promise((r) => proc.child.once("exit", r));
  proc.child.kill("SIGKILL");
  await exited;
}
const health = async (base) => {
  const r = await fetch(`${base}/health`);
  return { status: r.status, body: await r.json() };
};
/// Waits up to `ms` for /health to satisfy `ok`; returns the last answer.
async function awaitHealth(base, ok, ms = 20000) {
  const deadline = Date.now() + ms;
  let h;
  while (Date.now() < deadline) {
    h = await health(base);
    if (ok(h)) return h;
    await sleep(100);
  }
  return h;
}

const gen = spawnSync(args.paged, ["gen-certs", certs], { encoding: "utf8" });
if (gen.status !== 0) throw new Error(`gen-certs: ${gen.stderr}`);
const workers = [await startWorker(), await startWorker()];
const address = (w) => `127.0.0.1:${w.port}`;
const head = await startServer(["--workers", workers.map(address).join(","), "--tls-dir", certs]);
process.on("exit", (code) => {
  if (code === 0) return;
  console.error(`---- the head's output:\n${head.output().slice(-4000)}`);
  workers.forEach((w, i) => console.error(`---- worker ${i}'s output:\n${w.output().slice(-2000)}`));
});
const reference = await startServer([]);  // in-process: what every request must give
const headBase = `http://127.0.0.1:${head.port}`;
const refBase = `http://127.0.0.1:${reference.port}`;
await waitForHealth(headBase);
await waitForHealth(refBase);
const client = new OpenAI({ baseURL: `${headBase}/v1`, apiKey: "unused", maxRetries: 0 });
const refClient = new OpenAI({ baseURL: `${refBase}/v1`, apiKey: "unused", maxRetries: 0 });
const model = "stories260K";

let h = await health(headBase);
checkEqual(h, { status: 200, body: { status: "ok", replicas: workers.map((w) => ({ kind: "remote", address: address(w), state: "ready" })) } },
  "/health lists both replicas ready");

async function goldenPass(what) {
  for (const g of golden) {
    const r = await client.completions.create({ model, prompt: g.prompt, max_tokens: 64, temperature: 0 });
    checkEqual(r.choices[0].text, g.text, `${what}: greedy completion of "${g.prompt}"`);
  }
}
await Promise.all([goldenPass("two replicas"), goldenPass("two replicas, concurrently")]);
let m = await metrics(headBase);
const steps = (i) => m[`paged_replica_steps_total{replica="${i}",address="${address(workers[i])}"}`];
check(steps(0) > 0 && steps(1) > 0, "both replicas ran steps", [steps(0), steps(1)]);

// ---- failover: 16 seeded streams, the busier worker killed while they run -------------------------------------
const requests = Array.from({ length: 16 }, (_, i) => ({
  model, prompt: golden[i % golden.length].prompt, max_tokens: 300, temperature: 0.8, seed: 100 + i, ignore_eos: true,
}));
const expected = await Promise.all(requests.map((r) => refClient.completions.create(r)));
const progress = new Array(requests.length).fill(0);
const streams = requests.map(async (r, i) => {
  let text = "";
  let finishReason = null;
  let usage = null;
  try {
    for await (const chunk of await client.completions.create({ ...r, stream: true, stream_options: { include_usage: true } })) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finishReason = c.finish_reason;
      }
      progress[i]++;
    }
  } catch (e) {
    finishReason = `error: ${e.message}`;
    progress[i] = Infinity;
  }
  return { text, finishReason, usage };
});
while (progress.some((p) => p < 3)) await sleep(5);
m = await metrics(headBase);
const running = (i) => m[`paged_replica_num_requests_running{replica="${i}",address="${address(workers[i])}"}`] +
  m[`paged_replica_num_requests_waiting{replica="${i}",address="${address(workers[i])}"}`];
const victim = running(0) >= running(1) ? 0 : 1;
const survivor = 1 - victim;
check(running(victim) > 0, "the worker killed was serving streams", [running(0), running(1)]);
await kill(workers[victim]);
const results = await Promise.all(streams);
if (results.some((r) => r.finishReason !== "length")) console.error("health after the failover:", JSON.stringify(await health(headBase)));
for (let i = 0; i < results.length; i++) {
  checkEqual(results[i].text, expected[i].choices[0].text, `stream ${i} (seed ${requests[i].seed}) gives the in-process text`);
  checkEqual(results[i].finishReason, "length", `stream ${i} finishes by length`);
  checkEqual(results[i].usage?.completion_tokens, 300, `stream ${i} counts its 300 tokens once`);
}
m = await waitForDrained(headBase);
check(m.paged_request_moved_total > 0, "requests moved to the replica left", m.paged_request_moved_total);
checkEqual(m.paged_kv_blocks_free, m.paged_kv_blocks_total, "the replica left got every block back");
check(m.paged_kv_blocks_total > 0, "the KV totals count the replica left", m.paged_kv_blocks_total);
checkEqual(m[`paged_replica_up{replica="${victim}",address="${address(workers[victim])}"}`], 0, "the lost replica is down on /metrics");

h = await health(headBase);
check(h.status === 200 && h.body.replicas[victim].state === "lost" && h.body.replicas[survivor].state === "ready" &&
  typeof h.body.replicas[victim].reason === "string", "/health: 200, one replica lost (with a reason), one ready", h);

// ---- rejoin: the killed worker restarts on its port and is routed to again ------------------------------------
workers[victim] = await startWorker(workers[victim].port);
h = await awaitHealth(headBase, (x) => x.body.replicas.every((r) => r.state === "ready"));
check(h.body.replicas.every((r) => r.state === "ready"), "the restarted worker rejoins within 20 s", h);
await kill(workers[survivor]);
h = await awaitHealth(headBase, (x) => x.body.replicas[survivor].state === "lost");
checkEqual([h.status, h.body.replicas[victim].state], [200, "ready"], "the other killed: the rejoined replica serves alone");
await goldenPass("the rejoined replica alone");

// ---- no replica left: 503 ---------------------------------------------------------------------------------------
await kill(workers[victim]);
h = await awaitHealth(headBase, (x) => x.status === 503);
checkEqual([h.status, h.body.status], [503, "unavailable"], "/health: 503 with every replica lost");
const refused = await fetch(`${headBase}/v1/completions`, {
  method: "POST", headers: { "content-type": "application/json" },
  body: JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 4 }),
});
checkEqual(refused.status, 503, "a completion with no replica left: 503");
finish("check_replicas");
process.exit(0);  // the servers still hold the event loop
