// Clients that drop mid-generation: a streamed one after its first chunks and a non-streamed one while it waits.
// Their requests must be aborted and their KV blocks freed again (seen in /metrics).
// Usage: node check_disconnect.mjs --base http://127.0.0.1:PORT
import http from "node:http";
import { check, checkEqual, finish, metrics, parseArgs, sleep, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
await waitForHealth(base);
const before = await waitForDrained(base);
const url = new URL(`${base}/v1/completions`);

/// Starts a long generation and destroys the connection once `dropWhen` says so; resolves with the bytes seen.
/// `close`: the request says "Connection: close" (the server reads no further request on it).
function droppedRequest(stream, dropWhen, close = false) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ prompt: "Once upon a time", max_tokens: 400, ignore_eos: true, temperature: 0, stream });
    let seen = "";
    const req = http.request(
      { host: url.hostname, port: url.port, path: url.pathname, method: "POST",
        headers: { "content-type": "application/json", ...(close ? { connection: "close" } : {}) } },
      (res) => {
        res.on("data", (d) => {
          seen += d.toString();
          if (dropWhen(seen)) {
            req.destroy();
            resolve(seen);
          }
        });
        res.on("end", () => resolve(seen));
      },
    );
    req.on("error", () => resolve(seen));
    req.end(body);
    if (!stream) {
      setTimeout(() => {
        req.destroy();
        resolve(seen);
      }, 30);
    }
  });
}

// Streamed: drop after two SSE frames.
const streamed = await droppedRequest(true, (s) => s.split("data: ").length > 2);
check(streamed.includes("data: ") && !streamed.includes("[DONE]"), "the streamed client left mid-stream", streamed.slice(0, 200));
let m = await waitForDrained(base);
checkEqual(m.paged_kv_blocks_free, m.paged_kv_blocks_total, "blocks of the dropped stream are free again");
checkEqual(m.paged_request_aborted_total - before.paged_request_aborted_total, 1, "the dropped stream was aborted");

// Non-streamed: the client leaves while the engine works on its request.
const waited = await droppedRequest(false, () => false);
checkEqual(waited, "", "the non-streamed client left before any response");
await sleep(50);
m = await waitForDrained(base);
checkEqual(m.paged_kv_blocks_free, m.paged_kv_blocks_total, "blocks of the dropped request are free again");
checkEqual(m.paged_request_aborted_total - before.paged_request_aborted_total, 2, "the dropped request was aborted");
checkEqual(m.paged_num_requests_running, 0, "nothing runs after the drops");

// The same with "Connection: close": the server reads no next request there, and sees the client leave all the same.
const closing = await droppedRequest(false, () => false, true);
checkEqual(closing, "", "the Connection: close client left before any response");
await sleep(50);
m = await waitForDrained(base);
checkEqual(m.paged_kv_blocks_free, m.paged_kv_blocks_total, "blocks of the Connection: close request are free again");
checkEqual(m.paged_request_aborted_total - before.paged_request_aborted_total, 3,
           "the Connection: close request was aborted");
finish("check_disconnect");
