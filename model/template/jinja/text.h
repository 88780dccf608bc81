// Strings as the JavaScript renderer sees them: code points over UTF-8 bytes (decoded and encoded with
// model/unicode/utf8.h), where bytes that are not valid UTF-8 survive as raw-byte code points, so that decoding and
// encoding again gives back the very same bytes. Plus JavaScript's whitespace, length and number formatting.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace paged::jinja {

/// A byte outside valid UTF-8 decodes to kRawByte + byte (above every code point) and encodes back unchanged.
inline constexpr char32_t kRawByte = 0x110000;

/// The code points of `s`; each byte of an invalid subpart (as utf8::next delimits it) becomes kRawByte + byte.
std::u32string code_points(std::string_view s);

/// Appends `c` to `out`: its UTF-8 encoding, or the byte itself when `c` is a raw byte.
void append_code_point(std::string& out, char32_t c);

/// The bytes of `cps` (code_points' inverse: from_code_points(code_points(s)) == s for every s).
std::string from_code_points(std::u32string_view cps);

/// JavaScript's WhiteSpace and LineTerminator code points (what String.prototype.trim and /\s/ use).
bool is_js_space(char32_t c);

/// [A-Za-z0-9_]: the characters of identifiers and of title case's words.
bool is_word_char(char c);

/// The control character that a backslash and `letter` stand for in JavaScript and JSON strings alike (\b \f \n
/// \r \t), or '\0'.
char control_of_escape(char letter);

/// The letter that escapes control character `c` in JavaScript and JSON strings alike (b f n r t), or '\0'.
char escape_of_control(char32_t c);

enum class Trim { both, start, end };

/// Strips code points in `set` (JS whitespace when `set` is null) from the chosen ends of `s`.
std::string trim(std::string_view s, Trim where, const std::u32string* set = nullptr);

/// String length in UTF-16 code units, as JavaScript counts it (a raw byte counts one).
int64_t js_length(std::string_view s);

/// Number.prototype.toString(): shortest round-trip digits, exponent form outside [1e-7, 1e21).
std::string js_number(double x);

/// JavaScript's Number(string): 0 for a blank string, NaN for one that is not a number.
double js_to_number(std::string_view s);

}  // namespace paged::jinja
