// NFC (model/unicode/nfc.cpp) on hand-picked cases; test_bpe_tokenizer.cpp checks it as tokenizer.json's
// normalizer, and the npm Qwen3 tokenizer (an NFC normalizer) checks it on NFD texts.
#include <catch2/catch.hpp>

#include <string>

#include "model/unicode/nfc.h"

TEST_CASE("NFC composes, reorders and keeps what is already composed", "[unicode]") {
  struct Case {
    std::string text, expected, why;
  };
  const Case cases[] = {
      {"", "", "empty"},
      {"plain ASCII\n", "plain ASCII\n", "below U+0300 nothing changes"},
      {"A\xCC\x8A", "\xC3\x85", "A + ring above -> U+00C5"},
      {"\xE2\x84\xA6", "\xCE\xA9", "U+2126 OHM SIGN -> U+03A9 (singleton)"},
      {"\xCD\x84", "\xCC\x88\xCC\x81", "U+0344 decomposes and does not recompose"},
      {"o\xCC\x88\xCC\x84", "\xC8\xAB", "o + diaeresis + macron -> U+022B (two steps)"},
      {"x\xCC\xA3\xCC\x82", "x\xCC\xA3\xCC\x82", "no composite: marks stay, below (220) before above (230)"},
      {"x\xCC\x82\xCC\xA3", "x\xCC\xA3\xCC\x82", "canonical ordering sorts the marks by class"},
      {"\xEA\xB0\x81", "\xEA\xB0\x81", "U+AC01, a precomposed Hangul LVT syllable, stays"},
      {"\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80", "Hangul L + V -> U+AC00"},
      {"\xF0\x9D\x85\x9E", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5", "U+1D15E (excluded) decomposes, four-byte UTF-8"},
  };
  for (const Case& c : cases) {
    INFO(c.why);
    CHECK(paged::unicode::nfc(c.text) == c.expected);
  }
}
