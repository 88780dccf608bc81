// JSON Schema's string `format`s as grammar expressions: the characters of a string value (inside its quotes) of
// date, time, date-time, duration, uuid, email, hostname, ipv4, ipv6 and uri, each a subset of what RFC 3339 / 4122 /
// 5321 / 1123 / 4291 / 3986 (and ajv-formats' "full" checks) admit, written the way a program writes them and the
// stricter common validators (zod, email-validator) take them: 'T' upper case, a date-time in UTC ('Z'), a time
// with 'Z' or an offset with a colon, seconds 00-59 (no leap second), fraction digits 1-9, IPv6 without an embedded
// IPv4 part, a uri as scheme "://" host [":" port] [path] ["?" query] ["#" fragment], a uuid of RFC 9562's versions
// and variant without "urn:uuid:", an email of letters, digits and "_+-" atoms with a top-level domain of letters.
// "password" and "binary" (OpenAPI's hints, any string to ajv-formats too) constrain nothing. Every character is
// printable ASCII other than '"' and '\', so it is written as itself and the byte length is the string's length.
#pragma once

#include <optional>
#include <string_view>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// The string length (in characters) a format's values may have: [min, max], max nullopt when unbounded.
struct LengthRange {
  int min = 0;
  std::optional<int> max;
};

/// True for the formats string_format knows (those it refuses included: none).
bool is_string_format(std::string_view format);

/// The strings of `format` no longer than `max_length` (nullopt: no bound), and the lengths they may have; nullopt
/// for "password" and "binary" (any string). Open-ended formats (email, hostname, uri) shrink their parts to fit
/// `max_length`. Throws GrammarError for a format it does not know, or when max_length leaves no value of it.
std::optional<std::pair<Expr, LengthRange>> string_format(std::string_view format, std::optional<int> max_length);

}  // namespace paged::constraint
