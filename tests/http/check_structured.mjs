// Structured outputs through the official openai client against `paged serve` on stories260K at temperature 1 and
// many seeds: every json_schema / guided_json answer parses and ajv validates it against its schema, json_object
// answers are objects, choice answers are a choice, regex answers match (JavaScript's RegExp); the same schema over
// the WebSocket protocol (/v1/stream); an unsupported keyword is a 400 (an error frame) naming the field. Tool
// calls: tool_choice "required" and a named function give tool_calls whose arguments ajv finds valid for the
// function's parameters. A schema as pydantic v2 writes one (string formats, a tuple, Optional, a nested model with
// a description beside its $ref, allOf) is validated by ajv (draft 2020-12) with ajv-formats; a zod schema through
// the client's zodResponseFormat and chat.completions.parse (draft-07: tuples as items lists) by zod itself. A
// structural tag's structures are each valid; one that no trigger opens is a 400.
// Usage: node check_structured.mjs --base http://127.0.0.1:PORT
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import WebSocket from "ws";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = "stories260K";
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { enum: ["cat", "dog", "once upon"] }, maxItems: 3 },
    home: { type: "object", properties: { city: { type: "string", pattern: "^[A-Z][a-z]{1,8}$" } }, required: ["city"] },
    kind: { anyOf: [{ type: "null" }, { const: "story" }] },
  },
  required: ["name", "age", "home"],
};
const validate = ajv.compile(schema);
const messages = [{ role: "user", content: "Tell me about a cat." }];

for (let seed = 0; seed < 12; ++seed) {
  const chat = await client.chat.completions.create({
    model, messages, temperature: 1, seed, max_tokens: 300,
    response_format: { type: "json_schema", json_schema: { name: "pet", schema, strict: true } },
  });
  const text = chat.choices[0].message.content;
  let value;
  try { value = JSON.parse(text); } catch { value = undefined; }
  check(value !== undefined && validate(value), `seed ${seed}: the chat answer is valid for its schema`, text);
  const completion = await client.completions.create({
    model, prompt: "Once upon a time", temperature: 1, seed, max_tokens: 300, guided_json: schema,
  });
  const ctext = completion.choices[0].text;
  try { value = JSON.parse(ctext); } catch { value = undefined; }
  check(value !== undefined && validate(value), `seed ${seed}: the completion (guided_json) is valid`, ctext);
  const object = await client.chat.completions.create({
    model, messages, temperature: 1, seed, max_tokens: 300, response_format: { type: "json_object" },
  });
  const otext = object.choices[0].message.content;
  if (object.choices[0].finish_reason === "stop") {
    try { value = JSON.parse(otext); } catch { value = undefined; }
    check(value !== null && typeof value === "object" && !Array.isArray(value), `seed ${seed}: json_object`, otext);
  }
  const choices = ["happy", "sad", "a big dog"];
  const choice = await client.completions.create({
    model, prompt: "The cat was", temperature: 1, seed, max_tokens: 20, structured_outputs: { choice: choices },
  });
  check(choices.includes(choice.choices[0].text), `seed ${seed}: choice`, choice.choices[0].text);
  const pattern = "(Tom|Lily) (ran|saw) [a-z]{1,10}( [a-z]{1,10}){0,3}\\.";
  const regex = await client.completions.create({
    model, prompt: "Once upon a time", temperature: 1, seed, max_tokens: 100, guided_regex: pattern,
  });
  check(new RegExp(`^(?:${pattern})$`).test(regex.choices[0].text), `seed ${seed}: regex`, regex.choices[0].text);
}
// pydantic v2's model_json_schema() of: class Owner(BaseModel): email: EmailStr = Field(max_length=40); id: UUID;
// class Pet(BaseModel): born: datetime; site: HttpUrl; size: tuple[int, constr(max_length=20)];
// owner: Owner = Field(description=...); ip: IPv4Address | None = None; trip: timedelta;
// price: float = Field(gt=0, le=100); delta: confloat(ge=-1, lt=1); plus an allOf as older
// generators write a described $ref. (The lengths keep stories260K's answers within max_tokens.)
const pydantic = {
  $defs: {
    Owner: { properties: { email: { format: "email", maxLength: 40, title: "Email", type: "string" },
                           id: { format: "uuid", title: "Id", type: "string" } },
             required: ["email", "id"], title: "Owner", type: "object" },
  },
  properties: {
    born: { format: "date-time", title: "Born", type: "string" },
    site: { format: "uri", maxLength: 2083, minLength: 1, title: "Site", type: "string" },
    size: { maxItems: 2, minItems: 2, prefixItems: [{ type: "integer" }, { type: "string", maxLength: 20 }], title: "Size", type: "array" },
    owner: { $ref: "#/$defs/Owner", description: "who feeds it" },
    vet: { allOf: [{ $ref: "#/$defs/Owner" }], description: "who heals it" },
    ip: { anyOf: [{ format: "ipv4", type: "string" }, { type: "null" }], default: null, title: "Ip" },
    trip: { format: "duration", title: "Trip", type: "string" },
    price: { exclusiveMinimum: 0, maximum: 100, title: "Price", type: "number" },
    delta: { exclusiveMaximum: 1, minimum: -1, title: "Delta", type: "number" },
  },
  required: ["born", "site", "size", "owner", "vet", "trip", "price", "delta"],
  title: "Pet", type: "object",
};
const validatePydantic = ajv.compile(pydantic);
for (let seed = 0; seed < 8; ++seed) {
  const chat = await client.chat.completions.create({
    model, messages, temperature: 1, seed, max_tokens: 480,
    response_format: { type: "json_schema", json_schema: { name: "Pet", schema: pydantic, strict: true } },
  });
  const text = chat.choices[0].message.content;
  let value;
  try { value = JSON.parse(text); } catch { value = undefined; }
  check(chat.choices[0].finish_reason === "stop" && value !== undefined && validatePydantic(value),
        `seed ${seed}: the pydantic schema's answer is valid (formats too)`, [text, validatePydantic.errors]);
}
// The openai client's own structured outputs: a zod schema (zod-to-json-schema, draft-07), the answer parsed and
// checked by zod, whose string checks (datetime without offset, email, uuid) are stricter than JSON Schema's.
const Pet = z.object({
  name: z.string().max(12),
  born: z.string().datetime(),
  owner: z.object({ email: z.string().email().max(40), id: z.string().uuid() }),
  weight: z.number().positive().max(80),
  legs: z.number().int().min(0).max(8),
  tags: z.array(z.enum(["cat", "dog"])).max(3),
  nick: z.string().max(8).nullable(),
  size: z.tuple([z.number().int(), z.string().max(6)]),
});
for (let seed = 0; seed < 6; ++seed) {
  let parsed, error;
  try {
    const r = await client.chat.completions.parse({
      model, messages, temperature: 1, seed, max_tokens: 400, response_format: zodResponseFormat(Pet, "pet"),
    });
    parsed = r.choices[0].message.parsed;
  } catch (e) {
    error = e.message;
  }
  check(parsed && Pet.safeParse(parsed).success, `seed ${seed}: zodResponseFormat's answer parses and zod accepts it`, error);
}
// vLLM's whitespace options: disable_any_whitespace writes the compact form, a whitespace_pattern its own spacing;
// disable_fallback and disable_additional_properties are taken (one engine; additionalProperties false already).
for (let seed = 0; seed < 4; ++seed) {
  const compact = await client.chat.completions.create({
    model, messages, temperature: 1, seed, max_tokens: 300,
    structured_outputs: { json: schema, disable_any_whitespace: true, disable_fallback: true, disable_additional_properties: true },
  });
  const ctext = compact.choices[0].message.content;
  let value;
  try { value = JSON.parse(ctext); } catch { value = undefined; }
  check(value !== undefined && validate(value) && JSON.stringify(value) === ctext,
        `seed ${seed}: disable_any_whitespace gives the compact form`, ctext);
  const spaced = await client.completions.create({
    model, prompt: "Once upon a time", temperature: 1, seed, max_tokens: 300, guided_json: schema,
    guided_whitespace_pattern: "\n?",
  });
  const stext = spaced.choices[0].text;
  try { value = JSON.parse(stext); } catch { value = undefined; }
  const skeleton = stext.replace(/"(?:[^"\\]|\\.)*"/g, '""');  // the text outside strings
  check(value !== undefined && validate(value) && !/[ \t\r]/.test(skeleton),
        `seed ${seed}: guided_whitespace_pattern "\\n?" spaces with newlines only`, stext);
}
// Structural tags (response_format "structural_tag", xgrammar's): free text in which every " the" (the stories
// model writes " there" and " the" all the time) opens a structure: a JSON object valid for its schema, then ".".
const tagSchema = { type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 99 } }, required: ["n"],
                    additionalProperties: false };
const validateTag = ajv.compile(tagSchema);
const structuralTag = { type: "structural_tag", triggers: [" the"],
                        structures: [{ begin: " the", schema: tagSchema, end: "." }] };
let tagged = 0;
for (let seed = 0; seed < 6; ++seed) {
  const r = await client.chat.completions.create({ model, messages, temperature: 1, seed, max_tokens: 150,
                                                   response_format: structuralTag });
  const text = r.choices[0].message.content;
  for (let at = text.indexOf(" the"); at >= 0; at = text.indexOf(" the", at)) {
    const m = text.slice(at + 4).match(/^(\{[^{}]*\})\./);
    if (!m && r.choices[0].finish_reason === "length") break;  // cut inside its last structure
    let value;
    try { value = m && JSON.parse(m[1]); } catch { value = undefined; }
    check(m && validateTag(value), `seed ${seed}: the structure after " the" at ${at} is valid`, text);
    if (!m) break;
    ++tagged;
    at += 4 + m[0].length;
  }
}
check(tagged >= 4, `structural tags were written (${tagged})`);
const badTag = await fetch(`${args.base}/v1/chat/completions`, {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, messages, response_format: { ...structuralTag, triggers: ["<f="] } }),
});
const badTagBody = await badTag.json();
checkEqual([badTag.status, badTagBody.error?.param], [400, "response_format"],
           "a structure that no trigger starts is a 400 naming response_format");
check(String(badTagBody.error?.message).includes("starts with no trigger"), "and says why", badTagBody);
const bad = await fetch(`${args.base}/v1/completions`, {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, prompt: "x", guided_json: { type: "array", uniqueItems: true } }),
});
const body = await bad.json();
checkEqual([bad.status, body.error?.param], [400, "guided_json"], "an unsupported keyword is a 400 naming the field");
check(String(body.error?.message).includes("'uniqueItems'"), "the message names the keyword", body);
// Tool calls forced by tool_choice, read back as tool_calls.
const weather = {
  type: "object", properties: { city: { type: "string", maxLength: 20 }, days: { type: "integer", minimum: 1, maximum: 14 } },
  required: ["city"], additionalProperties: false,
};
const tools = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city", parameters: weather } },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: { zone: { enum: ["utc", "local"] } }, required: ["zone"] } } },
];
const validators = { get_weather: ajv.compile(weather), get_time: ajv.compile(tools[1].function.parameters) };
// parallel_tool_calls false: one call, which ends; true: the stories model lists calls until max_tokens (then the
// answer is text, finish_reason "length"), so only complete lists are read; every single call must end.
let complete = 0;
for (let seed = 0; seed < 8; ++seed) {
  for (const [tool_choice, parallel_tool_calls] of [["required", false], ["required", true],
                                                    [{ type: "function", function: { name: "get_time" } }, true]]) {
    const r = await client.chat.completions.create({ model, messages, temperature: 1, seed, max_tokens: 400, tools,
                                                     tool_choice, parallel_tool_calls });
    const choice = r.choices[0];
    const calls = choice.message.tool_calls ?? [];
    const what = `seed ${seed}, tool_choice ${JSON.stringify(tool_choice)}, parallel ${parallel_tool_calls}`;
    if (parallel_tool_calls && tool_choice === "required" && choice.finish_reason === "length") continue;
    ++complete;
    check(calls.length >= 1 && choice.message.content === null && choice.finish_reason === "tool_calls", `${what}: tool_calls`, choice);
    if (!parallel_tool_calls) checkEqual(calls.length, 1, `${what}: one call`);
    if (tool_choice !== "required") checkEqual(calls.map((c) => c.function.name), ["get_time"], `${what}: the named function`);
    for (const c of calls) {
      let args;
      try { args = JSON.parse(c.function.arguments); } catch { args = undefined; }
      check(c.type === "function" && validators[c.function.name] && args !== undefined && validators[c.function.name](args),
            `${what}: the arguments of ${c.function.name} are valid for its parameters`, c);
    }
  }
}
check(complete >= 16, `every single forced call ends (${complete} of 24 answers complete)`);
const auto = await fetch(`${args.base}/v1/chat/completions`, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model, messages, tools }),
});
checkEqual([auto.status, (await auto.json()).error?.param], [400, "tool_choice"], "tool_choice auto (the default) is a 400");

// The WebSocket protocol: generations under the schema, and an error frame for an unsupported keyword.
const ws = new WebSocket(`${args.base.replace(/^http/, "ws")}/v1/stream`);
await new Promise((resolve, reject) => { ws.once("open", resolve); ws.once("error", reject); });
const texts = {}, done = {}, errors = {};
const seeds = [0, 1, 2, 3];
const finished = new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("timed out waiting for the WebSocket generations")), 60000);
  ws.on("message", (data) => {
    const f = JSON.parse(data.toString());
    if (f.type === "token") texts[f.id] = (texts[f.id] ?? "") + f.text;
    if (f.type === "done") done[f.id] = f;
    if (f.type === "error") errors[f.id] = f;
    if (seeds.every((s) => done[`s${s}`]) && errors.bad) {
      clearTimeout(timer);
      resolve();
    }
  });
});
for (const seed of seeds)
  ws.send(JSON.stringify({ type: "generate", id: `s${seed}`, prompt: "Once upon a time", temperature: 1, seed,
                           max_tokens: 300, response_format: { type: "json_schema", json_schema: { name: "pet", schema } } }));
ws.send(JSON.stringify({ type: "generate", id: "bad", prompt: "x", guided_regex: "a(?=b)" }));
await finished;
ws.close();
for (const seed of seeds) {
  let value;
  try { value = JSON.parse(texts[`s${seed}`] ?? ""); } catch { value = undefined; }
  check(value !== undefined && validate(value), `WebSocket seed ${seed}: valid for its schema`, texts[`s${seed}`]);
}
check(JSON.stringify(errors.bad).includes("guided_regex") && JSON.stringify(errors.bad).includes("lookaround"),
      "WebSocket: an unsupported regex is an error frame naming the field", errors.bad);
finish("check_structured");
