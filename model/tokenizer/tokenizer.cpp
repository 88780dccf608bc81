#include "model/tokenizer/tokenizer.h"

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>


namespace paged {
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 prefix of the character starting at s[0] (Unicode's "maximal subpart"):
// returns {bytes examined, complete}. complete=false with bytes == s.size() means "valid so far, needs more bytes".
// complete=false with bytes < s.size() means invalid after `bytes` bytes (at least 1 is consumed).
struct CharScan {
  size_t len;
  bool complete;
  bool needs_more;
};

CharScan scan_char(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;        // no overlongs
    if (b0 == 0xED) hi = 0x9F;        // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;        // <= U+10FFFF
  } else {
    return {1, false, false};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {i, false, true};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {i, false, false};
  }
  return {need, true, false};
}

// Appends to `out` every complete character of `bytes`, invalid subparts as U+FFFD; returns how many bytes were
// consumed (an incomplete tail is left unless `final`).
size_t emit_utf8(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    CharScan c = scan_char(bytes.substr(i));
    if (c.complete) {
      out.append(bytes.substr(i, c.len));
    } else if (c.needs_more && !final) {
      break;
    } else {
      out.append(kReplacement);
    }
    i += c.len;
  }
  return i;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    CharScan c = scan_char(s.substr(i));
    if (!c.complete) return false;
    i += c.len;
  }
  return true;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string bytes = tok_->token_bytes(id, first_);
  if (bytes.empty()) return {};
  first_ = false;
  pending_ += bytes;
  std::string out;
  pending_.erase(0, emit_utf8(pending_, false, out));
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  emit_utf8(pending_, true, out);
  pending_.clear();
  first_ = true;
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  IncrementalDetokenizer d(*this);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.finish();
}

}  // namespace paged
