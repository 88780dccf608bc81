// Reference verdicts for the constraint compilers' test (tests/model/constraint/test_compilers_js.cpp): reads
// {cases: [{kind: "schema" | "regex", spec, strings}]} and writes, per string, whether ajv (draft 2020-12, not
// strict, with ajv-formats' full format checks) finds it a valid JSON text for the schema, with its compact
// re-serialisation, or whether JavaScript's RegExp matches the whole string.
// Usage: node check_constraint_strings.mjs IN.json OUT.json
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { readFileSync, writeFileSync } from "node:fs";

const [input, output] = process.argv.slice(2);
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
const cases = JSON.parse(readFileSync(input, "utf8")).cases;
const results = cases.map((c) => {
  if (c.kind === "regex") {
    const re = new RegExp(`^(?:${c.spec})$`);
    return { valid: c.strings.map((s) => re.test(s)) };
  }
  const validate = ajv.compile(JSON.parse(c.spec));
  const valid = [], compact = [];
  for (const s of c.strings) {
    let value, parsed = true;
    try { value = JSON.parse(s); } catch { parsed = false; }
    const ok = parsed && validate(value);
    valid.push(ok);
    compact.push(ok ? JSON.stringify(value) : null);
  }
  return { valid, compact };
});
writeFileSync(output, JSON.stringify({ results }));
