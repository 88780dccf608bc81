// A server whose waiting queue is tiny (--max-num-seqs 1 --max-waiting-requests 1): a burst of requests gets some
// 503s with an OpenAI error body, the others complete, and the pool drains afterwards.
// Usage: node check_overload.mjs --base http://127.0.0.1:PORT
import { check, checkEqual, finish, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
await waitForHealth(base);

const burst = await Promise.all(
  Array.from({ length: 16 }, () =>
    fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 100, ignore_eos: true, temperature: 0 }),
    }).then(async (r) => ({ status: r.status, body: await r.json() })),
  ),
);
const overloaded = burst.filter((r) => r.status === 503);
const ok = burst.filter((r) => r.status === 200);
check(overloaded.length > 0, "a burst over the waiting limit gets 503s", burst.map((r) => r.status));
checkEqual(ok.length + overloaded.length, burst.length, "every request is either served or refused with 503");
check(overloaded.every((r) => r.body.error && r.body.error.type === "server_error" && typeof r.body.error.message === "string"),
      "503 bodies are OpenAI errors", overloaded[0]?.body);
check(ok.every((r) => r.body.usage.completion_tokens === 100), "the admitted requests complete", ok.map((r) => r.body.usage));
const m = await waitForDrained(base);
check(m.paged_kv_blocks_free === m.paged_kv_blocks_total, "KV pool drained after the burst", m);
finish("check_overload");
