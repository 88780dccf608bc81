// LoRA adapters over the OpenAI API with the official client: a server started with --enable-lora --lora-modules
// NAME=DIR lists the adapter in /v1/models (parent the served model, root its folder), answers a request naming it as
// a second server answers on the checkpoint with the adapter merged into its weights (make_lora.mjs), greedy and
// seeded, whole and streamed, chat too, with the adapter's name as the answer's model; requests of the base model
// and of the adapter at once each get their own answers; an unknown model is a 404. With --runtime 1 (a server
// started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), /v1/load_lora_adapter and /v1/unload_lora_adapter too.
// Usage: node check_lora.mjs --base http://127.0.0.1:PORT --merged http://127.0.0.1:PORT2 --adapter NAME
//        --adapter-path DIR --golden .../stories260K-greedy.json [--runtime 1]
import fs from "node:fs";
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, sleep, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
await waitForHealth(args.merged);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const reference = new OpenAI({ baseURL: `${args.merged}/v1`, apiKey: "unused", maxRetries: 0 });
const models = (await client.models.list()).data;
const baseModel = models[0].id;
const refModel = (await reference.models.list()).data[0].id;
const card = models.find((m) => m.id === args.adapter);
check(card !== undefined, "/v1/models lists the adapter", models);
checkEqual(card?.parent, baseModel, "the adapter's parent is the served model");
checkEqual(card?.root, args["adapter-path"], "the adapter's root is its folder");

const prompts = JSON.parse(fs.readFileSync(args.golden, "utf8")).cases.map((c) => c.prompt);
const logprobsClose = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-3);
let differs = 0;
for (const [i, prompt] of prompts.entries()) {
  for (const params of [{ temperature: 0 }, { temperature: 0.8, seed: 11 + i }]) {
    const ask = (c, model) => c.completions.create({ model, prompt, max_tokens: 24, logprobs: 1, ...params });
    const [got, want, plain] = await Promise.all([ask(client, args.adapter), ask(reference, refModel),
                                                  ask(client, baseModel)]);
    checkEqual(got.choices[0].text, want.choices[0].text, `adapter = merged checkpoint, ${JSON.stringify(params)}: ${prompt}`);
    check(logprobsClose(got.choices[0].logprobs.token_logprobs, want.choices[0].logprobs.token_logprobs),
          "its logprobs are the merged checkpoint's", [got.choices[0].logprobs.token_logprobs, want.choices[0].logprobs.token_logprobs]);
    checkEqual(got.model, args.adapter, "the answer names the adapter");
    checkEqual(plain.model, baseModel, "a base request's answer names the model");
    differs += plain.choices[0].text !== got.choices[0].text;
  }
}
check(differs >= prompts.length, "the adapter changes the answers", differs);

// vLLM's vllm:lora_requests_info: the adapter of a request in flight runs; none once it ended.
const lora_info = async () => (await (await fetch(`${args.base}/metrics`)).text())
  .split("\n").find((l) => l.startsWith("vllm:lora_requests_info{"));
const long = await client.completions.create({ model: args.adapter, prompt: prompts[0], max_tokens: 300,
                                               ignore_eos: true, stream: true });
let seenRunning = false;
for await (const chunk of long) {
  if (!seenRunning) seenRunning = (await lora_info())?.includes(`running_lora_adapters="${args.adapter}"`);
}
check(seenRunning, "vllm:lora_requests_info names the adapter while its request runs", await lora_info());
const idle = /^vllm:lora_requests_info\{max_lora="\d+",running_lora_adapters="",waiting_lora_adapters=""\} \d/;
let ended = false;  // the scheduler counts the request's end after its last tokens went out
for (let i = 0; i < 50 && !ended; ++i) ended = idle.test(await lora_info()) || (await sleep(50), false);
check(ended, "and none once it ended", await lora_info());

// Streamed chat (the template of the served model) through the adapter.
const messages = [{ role: "user", content: "Tell me about a cat." }];
let streamed = "", model = "";
const stream = await client.chat.completions.create({ model: args.adapter, messages, max_tokens: 20, temperature: 0,
                                                     stream: true });
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? "";
  model = chunk.model;
}
const whole = await reference.chat.completions.create({ model: refModel, messages, max_tokens: 20, temperature: 0 });
checkEqual(streamed, whole.choices[0].message.content, "streamed chat through the adapter = the merged checkpoint's");
checkEqual(model, args.adapter, "the chunks name the adapter");

try {
  await client.completions.create({ model: "no-such-adapter", prompt: "Once", max_tokens: 2 });
  check(false, "an unknown model is refused");
} catch (e) {
  checkEqual(e.status, 404, "an unknown model is a 404");
  check(/no-such-adapter/.test(e.message), "the 404 names the model", e.message);
}
// Runtime updates (vLLM's, with VLLM_ALLOW_RUNTIME_LORA_UPDATING): the same adapter loaded under a second name
// answers as the first; unloaded, it is a 404 and gone from /v1/models; bad bodies and adapters are 400s.
if (args.runtime) {
  const post = (path, body) => fetch(`${args.base}/v1/${path}`, { method: "POST", body: JSON.stringify(body),
                                                                headers: { "Content-Type": "application/json" } });
  let r = await post("load_lora_adapter", { lora_name: "second", lora_path: args["adapter-path"] });
  checkEqual([r.status, await r.text()], [200, "Success: LoRA adapter 'second' added successfully."], "load");
  check((await client.models.list()).data.some((m) => m.id === "second"), "a loaded adapter is listed");
  const prompt = prompts[0];
  const [a, b] = await Promise.all(["second", args.adapter].map((model) =>
    client.completions.create({ model, prompt, max_tokens: 16, temperature: 0 })));
  checkEqual(a.choices[0].text, b.choices[0].text, "the adapter loaded at runtime answers as the one loaded at start");
  r = await post("load_lora_adapter", { lora_name: "second", lora_path: args["adapter-path"] });
  checkEqual(r.status, 400, "a name served already is a 400");
  r = await post("load_lora_adapter", { lora_name: baseModel, lora_path: args["adapter-path"] });
  checkEqual(r.status, 400, "the model's own name is a 400");
  r = await post("load_lora_adapter", { lora_name: "third", lora_path: "/no/such/folder" });
  checkEqual(r.status, 400, "a folder without an adapter is a 400");
  check(/lora_path/.test(JSON.stringify(await r.json())), "it names lora_path");
  r = await post("load_lora_adapter", { lora_name: "third", lora_path: args["adapter-path"], rank: 3 });
  checkEqual(r.status, 400, "an unknown field is a 400");
  r = await post("unload_lora_adapter", { lora_name: "second" });
  checkEqual([r.status, await r.text()], [200, "Success: LoRA adapter 'second' removed successfully."], "unload");
  check(!(await client.models.list()).data.some((m) => m.id === "second"), "an unloaded adapter is not listed");
  try {
    await client.completions.create({ model: "second", prompt, max_tokens: 2 });
    check(false, "an unloaded adapter's requests are refused");
  } catch (e) {
    checkEqual(e.status, 404, "an unloaded adapter is a 404");
  }
  r = await post("unload_lora_adapter", { lora_name: "second" });
  checkEqual(r.status, 404, "unloading it again is a 404");
} else {
  const r = await fetch(`${args.base}/v1/load_lora_adapter`, { method: "POST",
                                                              body: JSON.stringify({ lora_name: "x", lora_path: "/" }) });
  checkEqual(r.status, 404, "runtime updates are off without VLLM_ALLOW_RUNTIME_LORA_UPDATING");
}
finish("check_lora");
