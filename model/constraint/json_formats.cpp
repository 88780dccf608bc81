#include "model/constraint/json_formats.h"

#include <algorithm>
#include <string>

#include "model/constraint/regex.h"

namespace paged::constraint {

namespace {

// The byte lengths the strings of `e` may have (a reference: unbounded).
LengthRange length_range(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::bytes: return {1, 1};
    case Expr::Kind::ref: return {0, std::nullopt};
    case Expr::Kind::seq: {
      LengthRange r{0, 0};
      for (const Expr& x : e.items) {
        const LengthRange p = length_range(x);
        r.min += p.min;
        r.max = r.max && p.max ? std::optional<int>(*r.max + *p.max) : std::nullopt;
      }
      return r;
    }
    case Expr::Kind::alt: {
      LengthRange r = length_range(e.items.front());
      for (const Expr& x : e.items) {
        const LengthRange p = length_range(x);
        r.min = std::min(r.min, p.min);
        r.max = r.max && p.max ? std::optional<int>(std::max(*r.max, *p.max)) : std::nullopt;
      }
      return r;
    }
    case Expr::Kind::repeat: {
      const LengthRange p = length_range(e.items.front());
      LengthRange r{p.min * e.min, std::nullopt};
      if (e.max >= 0 && p.max) r.max = *p.max * e.max;
      if (e.max == 0 || p.max == 0) r.max = 0;
      return r;
    }
  }
  return {};
}

std::string n(int v) { return std::to_string(v); }

// A host name of `min_labels` or more labels and at most `budget` characters: up to six labels (fewer when the
// budget is short, so that each may have 7 characters), of at most 63.
std::string hostname(int budget, int min_labels) {
  const int labels = std::clamp((budget + 1) / 8, min_labels, 6);
  const int longest = std::min(63, (budget + 1) / labels - 1);
  if (longest < 1) return {};
  const std::string label = longest == 1 ? "[a-zA-Z0-9]"
                                         : "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0," + n(longest - 2) + "}[a-zA-Z0-9])?";
  return label + "(?:\\." + label + "){" + n(min_labels - 1) + "," + n(labels - 1) + "}";
}

const std::string kOctet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const std::string kHex4 = "[0-9a-fA-F]{1,4}";
const std::string kDate =
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
    "02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)";
const std::string kClock = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?";
const std::string kTime = kClock + "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

// A non-empty ordered choice of the parts a, b, c (each optional, at least one present).
std::string some_of(const std::string& a, const std::string& b, const std::string& c) {
  return "(?:" + a + "(?:" + b + ")?(?:" + c + ")?|" + b + "(?:" + c + ")?|" + c + ")";
}

// The pattern of `format` within `budget` characters (nullopt: unbounded); empty when nothing fits.
std::optional<std::string> format_pattern(std::string_view format, std::optional<int> budget) {
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDate + "T" + kClock + "Z";  // UTC: zod's datetime() refuses offsets
  if (format == "duration") {
    const std::string d = "[0-9]{1,9}";
    return "P(?:" + d + "W|" + some_of(d + "Y", d + "M", d + "D") + "(?:T" + some_of(d + "H", d + "M", d + "S") +
           ")?|T" + some_of(d + "H", d + "M", d + "S") + ")";
  }
  if (format == "uuid")  // RFC 9562's versions 1-8 and variant: what strict validators (zod 4) demand
    return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}";
  if (format == "ipv4") return "(?:" + kOctet + "\\.){3}" + kOctet;
  if (format == "ipv6") {
    const std::string h = kHex4, g = "(?:" + kHex4 + ":)", c = "(?::" + kHex4 + ")";
    return "(?:" + g + "{7}" + h + "|" + g + "{1,7}:|" + g + "{1,6}" + c + "|" + g + "{1,5}" + c + "{1,2}|" + g +
           "{1,4}" + c + "{1,3}|" + g + "{1,3}" + c + "{1,4}|" + g + "{1,2}" + c + "{1,5}|" + h + ":" + c +
           "{1,6}|:(?:" + c + "{1,7}|:))";
  }
  if (format == "hostname") return hostname(std::min(253, budget.value_or(253)), 1);
  if (format == "email") {
    // What every common validator takes (ajv-formats, zod, email-validator): dot-separated atoms of letters, digits,
    // '_', '+' and '-' (up to three of at most 20, or one of at most half the room), '@', host labels and a
    // top-level domain of letters.
    const std::string atom = "[a-zA-Z0-9_+-]";
    const int room = std::min(254, budget.value_or(254));
    const int local = std::min(62, (room - 1) / 2);
    const int after_at = room - 1 - local;
    const int tld = std::min(16, std::max(2, after_at / 3));
    if (local < 1 || after_at < tld + 2) return std::string();  // "a." before the top-level domain at least
    const std::string host = hostname(after_at - 1 - tld, 1);
    if (host.empty()) return std::string();
    const std::string local_part = local == 62 ? atom + "{1,20}(?:\\." + atom + "{1,20}){0,2}"
                                               : atom + "{1," + n(local) + "}";
    return local_part + "@" + host + "\\.[a-zA-Z]{2," + n(tld) + "}";
  }
  if (format == "uri") {
    const std::string scheme = "[a-zA-Z][a-zA-Z0-9+.-]{0,15}://", port = "(?::[0-9]{1,5})?";
    const std::string pchar = "(?:[a-zA-Z0-9._~!$&'()*+,;=:@/-]|%[0-9a-fA-F]{2})";
    const std::string qchar = "(?:[a-zA-Z0-9._~!$&'()*+,;=:@/?-]|%[0-9a-fA-F]{2})";
    const int fixed = 16 + 3 + 6;  // scheme, "://", port
    if (!budget)
      return scheme + hostname(253, 1) + port + "(?:/" + pchar + "*)?(?:\\?" + qchar + "*)?(?:#" + qchar + "*)?";
    const int host_room = std::min(253, (*budget - fixed) / 2);
    if (host_room < 1) return std::string();
    const int each = ((*budget - fixed - host_room) / 3 - 1) / 3;  // characters of each of path, query, fragment
    std::string tail;
    if (each >= 1) {
      const std::string count = "{0," + n(each) + "}";
      tail = "(?:/" + pchar + count + ")?(?:\\?" + qchar + count + ")?(?:#" + qchar + count + ")?";
    }
    return scheme + hostname(host_room, 1) + port + tail;
  }
  return std::nullopt;
}

}  // namespace

bool is_string_format(std::string_view format) {
  return format == "password" || format == "binary" || format_pattern(format, std::nullopt).has_value();
}

std::optional<std::pair<Expr, LengthRange>> string_format(std::string_view format, std::optional<int> max_length) {
  if (format == "password" || format == "binary") return std::nullopt;
  const std::optional<std::string> pattern = format_pattern(format, max_length);
  if (!pattern) throw GrammarError("JSON schema: the format '" + std::string(format) + "' is not supported");
  if (pattern->empty())
    throw GrammarError("JSON schema: no '" + std::string(format) + "' value fits 'maxLength' " + n(*max_length));
  Expr e = compile_regex(*pattern, RegexMatch::full);
  const LengthRange lengths = length_range(e);
  return std::pair{std::move(e), lengths};
}

}  // namespace paged::constraint
