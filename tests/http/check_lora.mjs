// LoRA adapters over the OpenAI API with the official client: a server started with --enable-lora --lora-modules
// NAME=DIR lists the adapter in /v1/models (parent the served model, root its folder), answers a request naming it as
// a second server answers on the checkpoint with the adapter merged into its weights (make_lora.mjs), greedy and
// seeded, whole and streamed, chat too, with the adapter's name as the answer's model; requests of the base model
// and of the adapter at once each get their own answers; an unknown model is a 404.
// Usage: node check_lora.mjs --base http://127.0.0.1:PORT --merged http://127.0.0.1:PORT2 --adapter NAME
//        --adapter-path DIR --golden .../stories260K-greedy.json
import fs from "node:fs";
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

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
finish("check_lora");
