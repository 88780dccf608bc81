// POST /v1/responses through the official openai client (client.responses.create) against `paged serve`: the answer
// is the chat completion of the same conversation (instructions as the system message), whole and streamed (the
// deltas add up to the final text, events in OpenAI's order with increasing sequence numbers), status incomplete at
// max_output_tokens, usage, text.format as a JSON schema, stored responses (retrieve, previous_response_id against
// chat of the whole conversation, input items, delete, 404s), and a 400 naming each field it does not support. With
// --reasoning (a server started with --reasoning-parser), the think block is a reasoning item before the message;
// with --tools (a server with a tool-call parser), a forced function call is a function_call item, whole and
// streamed, with the chat answer's name and arguments.
// Usage: node check_responses.mjs --base http://127.0.0.1:PORT [--reasoning 1] [--tools 1]
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const reasoning = Boolean(args.reasoning);

/// The chat completion of the same request, for comparison.
async function chatAnswer(messages, maxTokens, extra = {}) {
  const r = await client.chat.completions.create({ model, messages, max_tokens: maxTokens, temperature: 0, ...extra });
  return { ...r.choices[0], usage: r.usage };
}

function messageText(response) {
  const items = response.output.filter((o) => o.type === "message");
  check(items.length === 1 && items[0].content.length === 1 && items[0].content[0].type === "output_text",
    "one message item with one output_text part", response.output);
  return items[0]?.content[0]?.text;
}

function reasoningText(response) {
  const items = response.output.filter((o) => o.type === "reasoning");
  return items.length ? items[0].content.map((c) => c.text).join("") : null;
}

// ---- whole answers -------------------------------------------------------------------------------------------
for (const [input, instructions] of [["Once upon a time", undefined], ["Tell me about a cat", "You tell stories."]]) {
  const r = await client.responses.create({ model, input, instructions, max_output_tokens: 24, temperature: 0 });
  const messages = [...(instructions ? [{ role: "system", content: instructions }] : []), { role: "user", content: input }];
  const chat = await chatAnswer(messages, 24);
  checkEqual(messageText(r), chat.message.content ?? "", `responses == chat for "${input}"`);
  if (reasoning) checkEqual(reasoningText(r), chat.message.reasoning_content ?? null, `reasoning item of "${input}"`);
  else check(!r.output.some((o) => o.type === "reasoning"), "no reasoning item without a reasoning parser", r.output);
  checkEqual(r.output_text, messageText(r), "the client's output_text");
  check(r.object === "response" && r.id.startsWith("resp_"), "response object and id", r);
  checkEqual(r.instructions ?? null, instructions ?? null, "instructions repeated");
  const cut = chat.finish_reason === "length";
  checkEqual([r.status, r.incomplete_details], cut ? ["incomplete", { reason: "max_output_tokens" }] : ["completed", null],
    "status and incomplete_details follow the finish reason");
  check(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 &&
    r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, "usage", r.usage);
  checkEqual(r.usage.output_tokens_details?.reasoning_tokens, chat.usage.completion_tokens_details?.reasoning_tokens ?? 0,
    `the reasoning tokens of "${input}" are chat's`);
}
// Messages with input_text parts, a developer message, metadata repeated.
{
  const r = await client.responses.create({
    model, max_output_tokens: 16, temperature: 0, metadata: { run: "check" },
    input: [{ role: "developer", content: "Be brief." },
            { type: "message", role: "user", content: [{ type: "input_text", text: "The dog" }, { type: "input_text", text: " ran" }] }],
  });
  const chat = await chatAnswer([{ role: "system", content: "Be brief." }, { role: "user", content: "The dog ran" }], 16);
  checkEqual(messageText(r), chat.message.content ?? "", "input messages with parts == chat");
  checkEqual(r.metadata, { run: "check" }, "metadata repeated");
}

// ---- streamed ---------------------------------------------------------------------------------------------------
{
  const whole = await client.responses.create({ model, input: "The little bird", max_output_tokens: 40, temperature: 0 });
  const stream = await client.responses.create({ model, input: "The little bird", max_output_tokens: 40, temperature: 0,
    stream: true });
  const types = [];
  let deltas = "", reasoningDeltas = "", last = null, sequence = -1, ordered = true;
  for await (const event of stream) {
    types.push(event.type);
    ordered &&= event.sequence_number === sequence + 1;
    sequence = event.sequence_number;
    if (event.type === "response.output_text.delta") deltas += event.delta;
    if (event.type === "response.reasoning_text.delta") reasoningDeltas += event.delta;
    last = event;
  }
  check(ordered, "sequence numbers count up from 0", types);
  checkEqual(types.slice(0, 2), ["response.created", "response.in_progress"], "the stream opens with created, in_progress");
  check(["response.completed", "response.incomplete"].includes(last.type), "the stream ends with the response", last.type);
  const message = types.lastIndexOf("response.output_item.added");
  checkEqual(types.slice(message, message + 2), ["response.output_item.added", "response.content_part.added"],
    "the message item opens before its text");
  checkEqual(types.slice(-4, -1), ["response.output_text.done", "response.content_part.done", "response.output_item.done"],
    "the message item closes before the response ends");
  checkEqual(deltas, messageText(whole), "streamed deltas add up to the whole answer's text");
  checkEqual(messageText(last.response), deltas, "the final response holds the streamed text");
  // The prefix cache may differ.
  const tokens = (u) => [u.input_tokens, u.output_tokens, u.total_tokens, u.output_tokens_details?.reasoning_tokens];
  checkEqual(tokens(last.response.usage), tokens(whole.usage), "streamed usage == whole usage");
  if (reasoning) checkEqual(reasoningDeltas, reasoningText(whole) ?? "", "streamed reasoning == whole reasoning item");
}

// ---- text.format: a JSON schema (without a reasoning parser: stories260K writes no "</think>") -----------------
if (!reasoning) {
  const schema = { type: "object", properties: { name: { type: "string", maxLength: 12 }, age: { type: "integer" } },
                   required: ["name", "age"], additionalProperties: false };
  const r = await client.responses.create({ model, input: "A person as JSON", max_output_tokens: 200, temperature: 0,
    text: { format: { type: "json_schema", name: "person", schema, strict: true } } });
  let parsed = null;
  try { parsed = JSON.parse(messageText(r)); } catch { /* checked below */ }
  check(parsed && typeof parsed.name === "string" && Number.isInteger(parsed.age) && Object.keys(parsed).length === 2,
    "text.format json_schema: the answer is such an object", messageText(r));
}

// ---- function tools ------------------------------------------------------------------------------------------
if (args.tools) {
  const parameters = { type: "object", properties: { city: { type: "string", maxLength: 10 } }, required: ["city"],
                       additionalProperties: false };
  const request = { model, input: "What is the weather in Oslo?", max_output_tokens: 60, temperature: 0,
    tools: [{ type: "function", name: "get_weather", description: "The weather of a city", parameters }],
    tool_choice: { type: "function", name: "get_weather" } };
  const r = await client.responses.create(request);
  const chat = await chatAnswer([{ role: "user", content: request.input }], 60, {
    tools: [{ type: "function", function: { name: "get_weather", description: "The weather of a city", parameters } }],
    tool_choice: { type: "function", function: { name: "get_weather" } } });
  const calls = (response) => response.output.filter((o) => o.type === "function_call").map((c) => [c.name, c.arguments]);
  checkEqual(calls(r), chat.message.tool_calls.map((t) => [t.function.name, t.function.arguments]),
    "a forced call: the chat answer's call as a function_call item");
  check(typeof JSON.parse(calls(r)[0]?.[1] ?? "null")?.city === "string", "its arguments follow the schema", calls(r));
  check(!r.output.some((o) => o.type === "message"), "a call alone has no message item", r.output);
  checkEqual(r.tools.map((t) => t.name), ["get_weather"], "tools repeated");
  const streamed = [];
  let last = null;
  for await (const event of await client.responses.create({ ...request, stream: true })) {
    if (event.type === "response.function_call_arguments.done") streamed.push(event.arguments);
    last = event;
  }
  checkEqual(streamed, calls(r).map((c) => c[1]), "streamed: the call's arguments");
  checkEqual(calls(last.response), calls(r), "streamed: the final response's calls");
}

// ---- stored responses: retrieve, previous_response_id, input items, delete -----------------------------------
{
  const first = await client.responses.create({ model, input: "Once upon a time", max_output_tokens: 12, temperature: 0,
    instructions: "You tell stories." });
  checkEqual(first.store, true, "store is true by default (the server keeps responses)");
  const kept = await client.responses.retrieve(first.id);
  checkEqual(kept, first, "GET /v1/responses/{id}: the response as it was answered");
  // The next turn continues the stored conversation; the earlier instructions are not carried over (OpenAI's).
  const second = await client.responses.create({ model, input: "What happened next?", max_output_tokens: 12,
    temperature: 0, previous_response_id: first.id });
  checkEqual(second.previous_response_id, first.id, "previous_response_id repeated");
  const chat = await chatAnswer([{ role: "user", content: "Once upon a time" },
    { role: "assistant", content: messageText(first) }, { role: "user", content: "What happened next?" }], 12);
  checkEqual(messageText(second), chat.message.content ?? "", "a continued turn == chat of the whole conversation");
  const items = await client.responses.inputItems.list(second.id);
  checkEqual(items.data.map((i) => [i.type, i.role, i.content?.[0]?.text]),
    [["message", "user", "What happened next?"]], "input items: this turn's input");
  const third = await client.responses.create({ model, input: [{ role: "user", content: "And then?" }],
    max_output_tokens: 8, temperature: 0, previous_response_id: second.id, stream: true });
  let streamed = null;
  for await (const event of third) if (event.type === "response.completed" || event.type === "response.incomplete") streamed = event.response;
  checkEqual((await client.responses.retrieve(streamed.id)).output, streamed.output, "a streamed response is kept too");
  const deleted = await client.responses.delete(first.id).then(() => true, (e) => e);
  checkEqual(deleted, true, "DELETE /v1/responses/{id}");
  const gone = await client.responses.retrieve(first.id).then(() => null, (e) => e.status);
  checkEqual(gone, 404, "a deleted response is gone: 404");
  const unknown = await client.responses.create({ model, input: "x", previous_response_id: first.id }).then(
    () => null, (e) => [e.status, e.param]);
  checkEqual(unknown, [404, "previous_response_id"], "previous_response_id of a response not kept: 404 naming it");
  const unstored = await client.responses.create({ model, input: "x", max_output_tokens: 2, store: false });
  checkEqual(unstored.store, false, "store: false repeated");
  checkEqual(await client.responses.retrieve(unstored.id).then(() => null, (e) => e.status), 404,
    "store: false keeps nothing");
  const badPage = await fetch(`${args.base}/v1/responses/${second.id}/input_items?limit=0`);
  checkEqual([badPage.status, (await badPage.json()).error?.param], [400, "limit"], "input_items: a bad limit is a 400");
  const put = await fetch(`${args.base}/v1/responses/${second.id}`, { method: "PUT" });
  checkEqual(put.status, 405, "PUT /v1/responses/{id}: 405");
  // Two requests naming one X-Request-Id at once: one is answered as the response stored under it, the other is
  // refused naming the header (not both told "stored" while the store keeps one).
  const named = (input) => fetch(`${args.base}/v1/responses`, {
    method: "POST", headers: { "Content-Type": "application/json", "X-Request-Id": "twice" },
    body: JSON.stringify({ model, input, max_output_tokens: 64, temperature: 0 }),
  }).then(async (r) => ({ status: r.status, body: await r.json() }));
  const both = await Promise.all([named("Once upon a time"), named("Tell me about a cat")]);
  checkEqual(both.map((r) => r.status).sort(), [200, 400], "one X-Request-Id at once: one answered, one refused");
  const answered = both.find((r) => r.status === 200), refused = both.find((r) => r.status === 400);
  checkEqual(refused?.body.error?.param, "X-Request-Id", "the refusal names X-Request-Id");
  checkEqual((await client.responses.retrieve("resp_twice")).output, answered?.body.output,
    "the response stored under it is the one answered");
}

// ---- refusals --------------------------------------------------------------------------------------------------
for (const [name, body, param] of [
  ["a built-in tool", { input: "x", tools: [{ type: "web_search" }] }, "tools[0].type"],
  ["previous_response_id not a string", { input: "x", previous_response_id: 1 }, "previous_response_id"],
  ["no input", { max_output_tokens: 4 }, "input"],
  ["an image part", { input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x" }] }] }, "input[0].content"],
  ["a reasoning item", { input: [{ type: "reasoning", summary: [] }] }, "input[0].type"],
  ["a conversation the template rejects", { input: [{ role: "user", content: "a" }, { role: "user", content: "b" }] },
   "input"],
  ["max_output_tokens 0", { input: "x", max_output_tokens: 0 }, "max_output_tokens"],
  ["an unknown field", { input: "x", frobnicate: 1 }, "frobnicate"],
  ["temperature out of range", { input: "x", temperature: 5 }, "temperature"],
]) {
  const r = await fetch(`${args.base}/v1/responses`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, ...body }) });
  const b = await r.json().catch(() => null);
  checkEqual([r.status, b?.error?.param], [400, param], `400 naming ${param}: ${name}`);
}

finish("check_responses");
