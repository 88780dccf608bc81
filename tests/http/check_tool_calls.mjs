// Streamed tool calls through the official openai client against `paged serve` on stories260K at temperature 1 and
// many seeds: what the client reassembles from the stream (chat.completions.stream, finalChatCompletion) equals the
// non-streamed answer of the same seed, for forced calls (tool_choice "required", a named function) and for
// tool_choice "auto" read by the server's --tool-call-parser. The stories model writes no call on its own, so the
// auto calls are written under a regex in the parser's format (content, then one or two calls); free auto answers
// stay content; parallel_tool_calls false reads the first call alone.
// Usage: node check_tool_calls.mjs --base http://127.0.0.1:PORT --parser hermes|llama3_json|mistral|pythonic
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = "stories260K";
const messages = [{ role: "user", content: "What is the weather in Oslo?" }];
const tools = [
  { type: "function", function: { name: "get_weather", parameters: {
    type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", parameters: {
    type: "object", properties: { zone: { enum: ["utc", "local"] } }, required: ["zone"] } } },
];
// The calls in the parser's format, as a regex: content, then get_weather and get_time.
const city = '\\{"city": "[A-Z][a-z]{1,8}"\\}', zone = '\\{"zone": "(utc|local)"\\}';
const formats = {
  hermes: `(Sure|Let me see)\\. <tool_call>\\{"name": "get_weather", "arguments": ${city}\\}</tool_call>` +
          `\\n<tool_call>\\{"name": "get_time", "arguments": ${zone}\\}</tool_call>`,
  llama3_json: `<\\|python_tag\\|>\\{"name": "get_weather", "parameters": ${city}\\}` +
               `; \\{"name": "get_time", "parameters": ${zone}\\}`,
  // Both of Mistral's forms, in turn: NAME[ARGS]ARGUMENTS per call (newer tokenizers), a JSON list (v3).
  mistral: [`(Sure|Let me see)\\. \\[TOOL_CALLS\\]get_weather\\[ARGS\\]${city}\\[TOOL_CALLS\\]get_time\\[ARGS\\]${zone}`,
            `(Sure|Let me see)\\. \\[TOOL_CALLS\\]\\[\\{"name": "get_weather", "arguments": ${city}\\}, ` +
            `\\{"name": "get_time", "arguments": ${zone}\\}\\]`],
  pythonic: `\\[get_weather\\(city='[A-Z][a-z]{1,8}'\\), get_time\\(zone="(utc|local)"\\)\\]`,
};
// Mistral's call ids are 9 letters and digits (its chat templates refuse others); the rest start with call_.
const callId = args.parser === "mistral" ? /^[A-Za-z0-9]{9}$/ : /^call_/;
const patterns = [].concat(formats[args.parser] ?? []);  // a format's forms, taken in turn by pairs of seeds
check(patterns.length > 0, `a known parser (${args.parser})`);

// The answer as the comparison sees it: the content (empty is none), the calls' names and arguments, the finish.
const answer = (choice) => ({
  content: choice.message.content || null,
  calls: (choice.message.tool_calls ?? []).map((c) => [c.type, c.function.name, c.function.arguments]),
  finish: choice.finish_reason,
});

async function both(what, request) {
  const whole = await client.chat.completions.create(request);
  const stream = client.chat.completions.stream({ ...request, stream: true });
  let chunks = 0;
  for await (const chunk of stream) chunks += chunk.choices.length > 0 ? 1 : 0;
  const joined = await stream.finalChatCompletion();
  const a = answer(whole.choices[0]), b = answer(joined.choices[0]);
  // An answer cut by max_tokens inside a call is text whole, while its stream sent the call begun (it cannot take
  // it back): only the finish reasons are compared then.
  if (a.finish === "length") checkEqual(b.finish, "length", `${what}: cut short, streamed or not`);
  else checkEqual(JSON.stringify(b), JSON.stringify(a), `${what}: the stream reassembles to the whole answer`);
  for (const c of joined.choices[0].message.tool_calls ?? [])
    check(callId.test(c.id), `${what}: a streamed call has an id`, c);
  return { answer: a, chunks };
}

let calls = 0, contents = 0;
for (let seed = 0; seed < 6; ++seed) {
  const base = { model, messages, tools, temperature: 1, seed, max_tokens: 300 };
  // Forced calls, streamed as argument fragments.
  for (const [tool_choice, parallel_tool_calls] of [["required", false], [{ type: "function", function: { name: "get_time" } }, true]]) {
    const { answer: a, chunks } = await both(`seed ${seed}, tool_choice ${JSON.stringify(tool_choice)}`,
                                             { ...base, tool_choice, parallel_tool_calls });
    if (a.finish === "tool_calls") {
      ++calls;
      check(chunks > 2, `seed ${seed}: the arguments came in fragments (${chunks} chunks)`);
    }
  }
  // tool_choice auto, the answer written in the parser's format.
  const parallel_tool_calls = seed % 2 === 0;
  const { answer: a } = await both(`seed ${seed}, auto in ${args.parser}'s format, parallel ${parallel_tool_calls}`,
                                   { ...base, tool_choice: "auto", parallel_tool_calls,
                                     structured_outputs: { regex: patterns[Math.floor(seed / 2) % patterns.length] } });
  checkEqual(a.finish, "tool_calls", `seed ${seed}: auto read the calls`);
  checkEqual(a.calls.map((c) => c[1]), parallel_tool_calls ? ["get_weather", "get_time"] : ["get_weather"],
             `seed ${seed}: the calls' names`);
  let parsed;
  try { parsed = JSON.parse(a.calls[0]?.[2]); } catch { parsed = undefined; }
  check(parsed && /^[A-Z][a-z]{1,8}$/.test(parsed.city), `seed ${seed}: its arguments parse`, a);
  if (args.parser === "hermes" || args.parser === "mistral")
    check(/^(Sure|Let me see)\. $/.test(a.content), `seed ${seed}: the content before the call`, a);
  else checkEqual(a.content, null, `seed ${seed}: ${args.parser} calls have no content`);
  // tool_choice auto, a free answer: content, streamed as it comes.
  const { answer: free } = await both(`seed ${seed}, auto, a free answer`, { ...base, max_tokens: 40 });
  if (free.calls.length === 0 && free.content) ++contents;
}
check(calls >= 8, `forced calls ended (${calls} of 12)`);
checkEqual(contents, 6, "free auto answers are content");
finish(`check_tool_calls (${args.parser})`);
