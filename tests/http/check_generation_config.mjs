// vLLM's --generation-config against `paged serve` on a copy of stories260K whose generation_config.json sets
// temperature 0 and max_new_tokens 12: a request that leaves temperature out is greedy (Hugging Face's golden
// continuation), one that sets it samples, and none generates past 12 tokens. With --vllm, a server started with
// --generation-config vllm: the file is not read.
// Usage: node check_generation_config.mjs --base http://127.0.0.1:PORT --golden .../stories260K-greedy.json
//        --model DIR [--vllm 1]
import OpenAI from "openai";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const golden = goldenContinuations(args.golden, args.model);
const g = golden.find((c) => c.greedy_ids.length >= 12);

const left_out = await client.completions.create({ model, prompt: g.prompt_ids, max_tokens: 40, ignore_eos: true,
                                                   logprobs: 1, seed: 5 });
const tokens = left_out.choices[0].logprobs.tokens.length;
if (args.vllm) {
  checkEqual(tokens, 40, "--generation-config vllm: max_tokens as asked");
} else {
  checkEqual(tokens, 12, "max_new_tokens caps max_tokens");
  // temperature 0 from the file: greedy, so each token is the likeliest, and the text is Hugging Face's.
  const lp = left_out.choices[0].logprobs;
  const greedy = lp.top_logprobs.every((top, i) => Math.max(...Object.values(top)) === lp.token_logprobs[i]);
  check(greedy, "a request without temperature is greedy", lp);
  const again = await client.completions.create({ model, prompt: g.prompt_ids, max_tokens: 12 });
  checkEqual(again.choices[0].text, left_out.choices[0].text, "greedy twice, the same text");
}
// A request's own temperature wins: seeded sampling differs from greedy somewhere over a few seeds.
let differs = false;
for (let seed = 1; seed <= 5 && !differs; ++seed) {
  const sampled = await client.completions.create({ model, prompt: g.prompt_ids, max_tokens: 12, temperature: 1.5,
                                                    seed });
  const greedy = await client.completions.create({ model, prompt: g.prompt_ids, max_tokens: 12, temperature: 0 });
  differs = sampled.choices[0].text !== greedy.choices[0].text;
}
check(differs, "temperature 1.5 in the request samples");
finish("check_generation_config");
