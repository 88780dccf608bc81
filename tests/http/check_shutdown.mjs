// Graceful shutdown of `paged serve`, in real processes, with the official openai client:
// - SIGTERM while 8 streams and 4 plain completions run, with time to finish (--shutdown-timeout 60): every one
//   finishes normally (finish_reason "length", the stream closed by [DONE]); a new connection is refused meanwhile,
//   and a new generation on an open connection gets 503;
//   the server exits 0;
// - SIGTERM with no time to finish (--shutdown-timeout 0): every stream ends with an error event and [DONE], every
//   plain completion with 503; the server exits 0.
// Usage: node check_shutdown.mjs --paged PATH/TO/paged --model DIR
import { spawn } from "node:child_process";
import net from "node:net";
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, sleep, waitForHealth } from "./common.mjs";

const args = parseArgs();
const children = [];
process.on("exit", () => children.forEach((c) => c.kill("SIGKILL")));

/// `paged serve MODEL ARGS` on a free port: the process, its port, its exit status (a promise) and its output.
function startServer(extra) {
  const child = spawn(args.paged, ["serve", args.model, "--port", "0", ...extra], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let output = "";
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve(signal ?? code)));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not report its port: ${output}`)), 30000);
    const scan = (data) => {
      output += data;
      const m = output.match(/http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]), exited, output: () => output });
      }
    };
    child.stdout.on("data", scan);
    child.stderr.on("data", scan);
  });
}

/// Runs 8 streams and 4 plain completions; SIGTERMs the server once every stream has sent 3 chunks; returns what
/// each got: {text, finishReason, done ([DONE] seen) or error} per stream, {status, finishReason} per completion.
async function runAndTerminate(server) {
  const base = `http://127.0.0.1:${server.port}`;
  await waitForHealth(base);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
  const request = (i) => ({ model: "stories260K", prompt: "Once upon a time", max_tokens: 480, temperature: 0.9,
                           seed: i, ignore_eos: true });
  const progress = new Array(8).fill(0);
  const streams = progress.map(async (_, i) => {
    // Raw SSE, to see the error event and [DONE] as they are sent.
    const r = await fetch(`${base}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...request(i), stream: true }),
    });
    const result = { text: "", finishReason: null, error: null, done: false };
    const decoder = new TextDecoder();
    let pending = "";
    for await (const bytes of r.body) {
      pending += decoder.decode(bytes, { stream: true });
      let at;
      while ((at = pending.indexOf("\n\n")) >= 0) {
        const event = pending.slice(0, at);
        pending = pending.slice(at + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") {
          result.done = true;
          continue;
        }
        const chunk = JSON.parse(data);
        if (chunk.error) result.error = chunk.error;
        for (const c of chunk.choices ?? []) {
          result.text += c.text;
          if (c.finish_reason) result.finishReason = c.finish_reason;
        }
        progress[i]++;
      }
    }
    return result;
  });
  const plain = [0, 1, 2, 3].map(async (i) => {
    try {
      const r = await client.completions.create(request(100 + i));
      return { status: 200, finishReason: r.choices[0].finish_reason };
    } catch (e) {
      return { status: e.status, code: e.code };
    }
  });
  while (progress.some((p) => p < 3)) await sleep(2);
  server.child.kill("SIGTERM");
  await sleep(100);
  // A new connection is refused; a new generation on a connection already open answers 503.
  const refused = await new Promise((resolve) => {
    const socket = net.connect(server.port, "127.0.0.1");
    socket.on("connect", () => { socket.destroy(); resolve(false); });
    socket.on("error", () => resolve(true));
  });
  const late = await fetch(`${base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request(200)),
  }).then((r) => r.status, () => "no answer");
  return { streams: await Promise.all(streams), plain: await Promise.all(plain), refused, late, code: await server.exited };
}

const patient = await runAndTerminate(await startServer(["--shutdown-timeout", "60"]));
checkEqual(patient.code, 0, "with time to finish: the server exits 0");
check(patient.refused, "a new connection is refused while the server drains");
check(patient.late === 503 || patient.late === "no answer", "a new generation while draining is not served", patient.late);
patient.streams.forEach((s, i) =>
  check(s.finishReason === "length" && s.done && !s.error, `stream ${i} finishes normally after SIGTERM`, s));
patient.plain.forEach((p, i) => checkEqual(p, { status: 200, finishReason: "length" }, `completion ${i} finishes normally`));

const hasty = await runAndTerminate(await startServer(["--shutdown-timeout", "0"]));
checkEqual(hasty.code, 0, "with no time to finish: the server exits 0");
hasty.streams.forEach((s, i) =>
  check(s.error && s.done && /shutting down/.test(s.error.message), `stream ${i} ends with an error event and [DONE]`, s));
hasty.plain.forEach((p, i) => checkEqual(p.status, 503, `completion ${i} answers 503`));
finish("check_shutdown");
process.exit(0);
