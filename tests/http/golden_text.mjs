// The text an OpenAI-style server returns for a golden greedy case: the continuation of the prompt,
// decode(prompt + output) - decode(prompt), as vLLM returns it. The golden files hold Hugging Face's decode of the
// output ids alone, which drops the leading space of a SentencePiece word marker ("▁") on the first id; the
// continuation keeps it. Which pieces carry the marker is read from the model's own tokenizer.model (SentencePiece's
// protobuf, parsed here), not from the tokenizer under test.
//   import { goldenContinuations } from "./golden_text.mjs";   // [{prompt, text, ...case}]
//   node golden_text.mjs GOLDEN.json MODEL_DIR                  // one JSON line {prompt, text} per case
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/// The pieces of a SentencePiece model, by id: ModelProto field 1 (repeated SentencePiece), whose field 1 is the
/// piece; every other field is skipped by its wire type.
export function sentencePieces(modelFile) {
  const buf = readFileSync(modelFile);
  let at = 0;
  const varint = () => {
    let value = 0n;
    for (let shift = 0n; ; shift += 7n) {
      const byte = buf[at++];
      value |= BigInt(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
  };
  const skip = (wireType) => {
    if (wireType === 0) varint();
    else if (wireType === 1) at += 8;
    else if (wireType === 2) {
      const length = Number(varint());  // read before `at` is: the varint moves it
      at += length;
    }
    else if (wireType === 5) at += 4;
    else throw new Error(`${modelFile}: wire type ${wireType} at byte ${at}`);
  };
  const pieces = [];
  while (at < buf.length) {
    const key = Number(varint());
    if (key >> 3 !== 1 || (key & 7) !== 2) {
      skip(key & 7);
      continue;
    }
    const length = Number(varint());
    const end = at + length;
    let piece = "";
    while (at < end) {
      const k = Number(varint());
      if (k >> 3 === 1 && (k & 7) === 2) {
        const n = Number(varint());
        piece = buf.toString("utf8", at, at + n);
        at += n;
      } else {
        skip(k & 7);
      }
    }
    pieces.push(piece);
  }
  return pieces;
}

/// The golden cases of `goldenFile` for the model in `modelDir`, each with `text`: the prompt's continuation.
export function goldenContinuations(goldenFile, modelDir) {
  const pieces = sentencePieces(path.join(modelDir, "tokenizer.model"));
  return JSON.parse(readFileSync(goldenFile, "utf8")).cases.map((c) => ({
    ...c,
    text: (pieces[c.greedy_ids[0]]?.startsWith("\u2581") ? " " : "") + c.greedy_text,
  }));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const c of goldenContinuations(process.argv[2], process.argv[3]))
    console.log(JSON.stringify({ prompt: c.prompt, text: c.text }));
}
