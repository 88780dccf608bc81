// Helpers shared by the HTTP integration scripts: arguments, assertions, health wait, metrics (the golden texts:
// golden_text.mjs).

/// --name value pairs of the command line.
export function parseArgs(argv = process.argv.slice(2)) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) args[argv[i].replace(/^--/, "")] = argv[i + 1];
  return args;
}

let failures = 0;
let checks = 0;

export function check(condition, what, detail) {
  checks++;
  if (!condition) {
    failures++;
    console.error(`FAIL: ${what}${detail !== undefined ? `\n      ${typeof detail === "string" ? detail : JSON.stringify(detail)}` : ""}`);
  }
  return condition;
}

export function checkEqual(actual, expected, what) {
  return check(JSON.stringify(actual) === JSON.stringify(expected), what, `got ${JSON.stringify(actual)}, want ${JSON.stringify(expected)}`);
}

/// Ends the script: exit 1 when any check failed.
export function finish(name) {
  if (failures) {
    console.error(`${name}: ${failures} of ${checks} checks failed`);
    process.exit(1);
  }
  console.log(`${name}: all ${checks} checks passed`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitForHealth(base, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    await sleep(200);
  }
  throw new Error(`${base}/health did not answer within ${timeoutMs} ms`);
}


/// The numeric samples of a Prometheus text exposition, by metric name (labels included in the name).
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return out;
}

/// Waits until the KV pool is fully free and nothing runs; returns the last metrics.
export async function waitForDrained(base, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  let m;
  while (Date.now() < deadline) {
    m = await metrics(base);
    if (m.paged_kv_blocks_free === m.paged_kv_blocks_total && m.paged_num_requests_running === 0 &&
        m.paged_num_requests_waiting === 0) {
      return m;
    }
    await sleep(50);
  }
  return m;
}
