// A WebSocket client that never reads cannot grow the server without bound: it asks for generations (of 1 to 4
// choices, half of them 2 tokens long: an event of several deltas, often the last one, may pass the bound in its
// middle, which crashed the server before 545c0b1, in about one run of three) while its socket is paused; the server
// closes the connection once its outbox passes ws_max_outbox_bytes, and its memory stays within 100 MB of what it
// was (the server runs with a small KV pool: the CPU runner's pool is allocated whole but its pages become resident
// as blocks are first used, which is no growth of the outbox). A reading client is served normally afterwards.
// Usage: node check_ws_reader.mjs --base http://127.0.0.1:PORT --pid SERVER_PID
import { readFileSync } from "node:fs";
import WebSocket from "ws";
import { check, finish, parseArgs, sleep, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
const rss = () => Number(readFileSync(`/proc/${args.pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)[1]) * 1024;
const url = `${args.base.replace("http", "ws")}/v1/stream`;
const before = rss();

const ws = new WebSocket(url);
await new Promise((resolve, reject) => { ws.on("open", resolve); ws.on("error", reject); });
ws._socket.pause();  // never read again
const closed = new Promise((resolve) => ws.on("close", (code) => resolve(code)));
let peak = before;
let sent = 0;
const deadline = Date.now() + 90000;
let code = null;
closed.then((c) => { code = c; });
while (code === null && Date.now() < deadline) {
  for (let i = 0; i < 16; ++i, ++sent)
    ws.send(JSON.stringify({ type: "generate", id: sent, prompt: "Once upon a time", ignore_eos: true,
                             max_tokens: sent % 2 ? 480 : 2, n: 1 + (sent % 4) }));
  peak = Math.max(peak, rss());
  await sleep(20);
}
check(code !== null, "the server closed the connection of a client that does not read", { sent });
check(peak - before < 100 * 1024 * 1024, "the server grew by less than 100 MB meanwhile",
  { before, peak, grown_mb: (peak - before) / 1048576 });

// A reading client still gets its generation.
const reader = new WebSocket(url);
const done = await new Promise((resolve, reject) => {
  reader.on("message", (data) => {
    const frame = JSON.parse(data.toString());
    if (frame.type === "done" || frame.type === "error") resolve(frame);
  });
  reader.on("open", () => reader.send(JSON.stringify({ type: "generate", id: 1, prompt: "Once upon a time", max_tokens: 8 })));
  reader.on("error", reject);
});
check(done.type === "done" && done.finish_reason === "length", "a reading client is served afterwards", done);
reader.close();
console.log(`ws reader: ${sent} generations asked, closed with ${code}, grew ${((peak - before) / 1048576).toFixed(1)} MB`);
finish("check_ws_reader");
process.exit(0);
