// UTF-8, the one codec of the project: decoding with Unicode's "maximal subpart" rule (no overlongs, surrogates or
// code points above U+10FFFF), encoding, validation.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace paged::utf8 {

/// The character at the start of a byte string.
struct Char {
  size_t length = 0;        // bytes it takes: the whole character, or the maximal invalid subpart (at least 1)
  bool complete = false;    // a well-formed character; code_point is valid
  bool needs_more = false;  // well-formed so far but cut short by the end of the string
  char32_t code_point = 0;
};

/// Decodes the character at the start of `s`, which must not be empty.
Char next(std::string_view s);

/// True when `s` is well-formed UTF-8.
bool is_valid(std::string_view s);

/// Appends the UTF-8 encoding of `cp` (at most U+10FFFF) to `out`.
void append(std::string& out, char32_t cp);

/// Appends every complete character of `bytes` to `out`, invalid subparts as U+FFFD; returns how many bytes were
/// consumed: a well-formed but incomplete tail is left unless `final`.
size_t append_replacing_invalid(std::string_view bytes, bool final, std::string& out);

/// ' ', \t, \n, \r, \v, \f (C's isspace in the "C" locale).
inline bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace paged::utf8
