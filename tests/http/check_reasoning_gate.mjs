// Structured outputs after the think block (vLLM's default, without --structured-outputs-in-reasoning) against
// `paged serve --reasoning-parser qwen3` on stories260K: the think block is free and the constraint starts after
// "</think>". The stories model never writes one, so a three-digit regex leaves its answers free, unless the prompt
// already holds the tag (a template with thinking off writes it), which starts the regex at once.
// Usage: node check_reasoning_gate.mjs --base URL
import { check, finish, parseArgs, waitForHealth } from "./common.mjs";

const { base } = parseArgs();
await waitForHealth(base);
const ask = async (text, seed) => {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: text }], temperature: 1, seed, max_tokens: 12,
                           structured_outputs: { regex: "[0-9]{3}" } }) });
  check(r.status === 200, `seed ${seed}: HTTP 200`, r.status);
  return r.status === 200 ? (await r.json()).choices[0].message : {};
};
let free = 0;
for (let seed = 0; seed < 4; ++seed) {
  const open = await ask("Tell me a story", seed);
  if (!/^[0-9]{3}$/.test(open.content ?? "")) ++free;
  const closed = await ask("<think>\n\n</think>\n\nA number", seed);
  check(/^[0-9]{3}$/.test(closed.content ?? ""), `seed ${seed}: a prompt holding </think> constrains at once`, closed);
}
check(free === 4, "answers without </think> are free", `${4 - free} of 4 were constrained`);
finish("check_reasoning_gate");
