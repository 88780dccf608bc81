#include "model/unicode/utf8.h"

namespace paged::utf8 {

Char next(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {1, true, false, b0};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {1, false, false, 0};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {i, false, true, 0};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {i, false, false, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {need, true, false, cp};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Char c = next(s.substr(i));
    if (!c.complete) return false;
    i += c.length;
  }
  return true;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t append_replacing_invalid(std::string_view bytes, bool final, std::string& out) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  size_t i = 0;
  while (i < bytes.size()) {
    const Char c = next(bytes.substr(i));
    if (c.complete) {
      out.append(bytes.substr(i, c.length));
    } else if (c.needs_more && !final) {
      break;
    } else {
      out.append(kReplacement);
    }
    i += c.length;
  }
  return i;
}

}  // namespace paged::utf8
