// Decoding with and without special tokens (Tokenizer::decode, IncrementalDetokenizer) on the shared stories260K
// SentencePiece tokenizer. The byte-level BPE side is in test_bpe_tokenizer.cpp.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <string>
#include <vector>

#include "model/tokenizer/load_tokenizer.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

// The token string tokenizer_config.json names under `key` ("bos_token", ...): what HF treats as special.
std::string config_token(const std::string& key) {
  return std::string(read_json(kModel + "/tokenizer_config.json").at(key).as_string());
}

// push() of every id, then finish(), on one detokenizer.
std::string decode_incrementally(const Tokenizer& tok, const std::vector<TokenId>& ids, bool skip_special_tokens) {
  IncrementalDetokenizer detokenizer(tok, skip_special_tokens);
  std::string text;
  for (TokenId id : ids) text += detokenizer.push(id);
  return text + detokenizer.finish();
}

}  // namespace

TEST_CASE("SentencePiece: special tokens are skipped or written as their pieces", "[tokenizer]") {
  auto tok = load_tokenizer(kModel);
  const std::string bos = config_token("bos_token"), eos = config_token("eos_token"), unk = config_token("unk_token");
  REQUIRE(tok->token_to_id(bos) == tok->bos_id());
  REQUIRE(tok->eos_ids() == std::vector<TokenId>{tok->token_to_id(eos)});
  const TokenId unk_id = tok->token_to_id(unk);
  REQUIRE(unk_id >= 0);

  CHECK(tok->special_token_text(tok->bos_id()) == bos);
  CHECK(tok->special_token_text(tok->token_to_id(eos)) == eos);
  CHECK(tok->special_token_text(unk_id) == unk);
  const std::string text = "Once upon a time";
  std::vector<TokenId> ids = tok->encode(text, true);
  REQUIRE(ids.front() == tok->bos_id());
  for (size_t i = 1; i < ids.size(); ++i) CHECK(tok->special_token_text(ids[i]).empty());
  ids.push_back(tok->token_to_id(eos));

  CHECK(tok->decode(ids) == text);
  CHECK(tok->decode(ids, true) == text);
  // HF's fast Llama tokenizer strips the dummy-prefix space only at the very start of the text: after "<s>" it stays.
  CHECK(tok->decode(ids, false) == bos + " " + text + eos);
  for (bool skip : {true, false}) CHECK(decode_incrementally(*tok, ids, skip) == tok->decode(ids, skip));

  // A special token in the middle; UNK is special too.
  const std::vector<TokenId> once = tok->encode("Once", false), time = tok->encode(" time", false);
  std::vector<TokenId> middle = once;
  middle.push_back(unk_id);
  middle.insert(middle.end(), time.begin(), time.end());
  CHECK(tok->decode(middle) == "Once time");
  CHECK(tok->decode(middle, false) == "Once" + unk + " time");

  // A byte that never completes its character still becomes U+FFFD before the special token's text.
  const TokenId lead_byte = tok->token_to_id("<0xC3>");
  REQUIRE(lead_byte >= 0);
  const std::vector<TokenId> cut{lead_byte, tok->token_to_id(eos)};
  CHECK(tok->decode(cut) == "\xEF\xBF\xBD");
  CHECK(tok->decode(cut, false) == "\xEF\xBF\xBD" + eos);
  CHECK(decode_incrementally(*tok, cut, false) == "\xEF\xBF\xBD" + eos);
}

TEST_CASE("a detokenizer after a prompt gives its continuation: decode(prompt + output) - decode(prompt)",
          "[tokenizer]") {
  auto tok = load_tokenizer(kModel);
  const boost::json::value golden = read_json(kGolden);
  for (const auto& c : golden.at("cases").as_array()) {
    std::vector<TokenId> prompt, output;
    for (const auto& id : c.at("prompt_ids").as_array()) prompt.push_back(static_cast<TokenId>(id.as_int64()));
    for (const auto& id : c.at("greedy_ids").as_array()) output.push_back(static_cast<TokenId>(id.as_int64()));
    std::vector<TokenId> all = prompt;
    all.insert(all.end(), output.begin(), output.end());
    const std::string prompt_text = tok->decode(prompt), whole = tok->decode(all);
    REQUIRE(whole.compare(0, prompt_text.size(), prompt_text) == 0);
    IncrementalDetokenizer detokenizer(*tok, true, prompt);
    std::string text;
    for (TokenId id : output) text += detokenizer.push(id);
    text += detokenizer.finish();
    CHECK(text == whole.substr(prompt_text.size()));
    // HF decodes the output alone without the first word's space; after the prompt it stays.
    const std::string alone(c.at("greedy_text").as_string());
    CHECK((text == alone || text == " " + alone));
  }
  // "The little dog was sad because" goes on with " he loved ..." (the golden text, decoded alone: "he loved ...").
  const auto& dog = golden.at("cases").as_array()[1];
  std::vector<TokenId> prompt, output;
  for (const auto& id : dog.at("prompt_ids").as_array()) prompt.push_back(static_cast<TokenId>(id.as_int64()));
  for (const auto& id : dog.at("greedy_ids").as_array()) output.push_back(static_cast<TokenId>(id.as_int64()));
  IncrementalDetokenizer detokenizer(*tok, true, prompt);
  CHECK(detokenizer.push(output[0]) == " he");
}
