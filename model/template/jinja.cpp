// The Jinja subset: a lexer (with the renderer's lstrip_blocks / trim_blocks preprocessing), a recursive-descent
// parser into one Node type, and a tree-walking interpreter over reference-counted values.
#include "model/template/jinja.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include <boost/json.hpp>

namespace paged::jinja {
namespace {

[[noreturn]] void fail(const std::string& message) { throw TemplateError(message); }

// ---- UTF-8 and JavaScript string semantics --------------------------------------------------------------------

// Bytes that are not valid UTF-8 decode to kRawByte + byte and encode back unchanged, so nothing is lost.
constexpr char32_t kRawByte = 0x110000;

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
    char32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = (b & 0xC0) == 0x80;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (!ok) {
      out.push_back(kRawByte + b0);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= kRawByte) {
    out.push_back(static_cast<char>(cp - kRawByte));
  } else if (cp < 0x80) {
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

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) append_utf8(out, cp);
  return out;
}

/// JavaScript's WhiteSpace and LineTerminator code points (what String.prototype.trim and /\s/ use).
bool is_js_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680: case 0x2028:
    case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

enum class Trim { both, start, end };

/// Strips code points in `set` (JS whitespace when `set` is null) from the chosen ends of `s`.
std::string trim(std::string_view s, Trim where, const std::u32string* set = nullptr) {
  const std::u32string cps = decode_utf8(s);
  auto strip = [&](char32_t c) { return set ? set->find(c) != std::u32string::npos : is_js_space(c); };
  size_t begin = 0, end = cps.size();
  if (where != Trim::end) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (where != Trim::start) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return encode_utf8(std::u32string_view(cps).substr(begin, end - begin));
}

/// String length in UTF-16 code units, as JavaScript counts it.
int64_t js_length(std::string_view s) {
  int64_t n = 0;
  for (char32_t c : decode_utf8(s)) n += (c >= 0x10000 && c < kRawByte) ? 2 : 1;
  return n;
}

/// Number.prototype.toString(): shortest round-trip digits, exponent form outside [1e-7, 1e21).
std::string js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  if (x == 0) return "0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(-n, '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0 ? "e+" : "e-") + std::to_string(std::abs(n - 1));
  }
  return sign + out;
}

// ---- values ---------------------------------------------------------------------------------------------------

enum class Kind { undefined, none, boolean, integer, floating, string, array, object, ns, function };

struct Value;
struct Scope;
using Array = std::vector<Value>;
struct Object;
struct Args;
using Function = std::function<Value(Args&, Scope&)>;

struct Value {
  Kind kind = Kind::undefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  std::string str;
  std::shared_ptr<Array> array;       // arrays and tuples; shared: identity as in JavaScript
  std::shared_ptr<Object> object;     // dicts and namespaces
  std::shared_ptr<Function> function;

  static Value none() { return make(Kind::none); }
  static Value of(bool b) {
    Value v = make(Kind::boolean);
    v.boolean = b;
    return v;
  }
  static Value of_int(int64_t i) {
    Value v = make(Kind::integer);
    v.integer = i;
    return v;
  }
  static Value of_float(double d) {
    Value v = make(Kind::floating);
    v.number = d;
    return v;
  }
  static Value of(std::string s) {
    Value v = make(Kind::string);
    v.str = std::move(s);
    return v;
  }
  static Value of(const char* s) { return of(std::string(s)); }
  static Value of(Array a) {
    Value v = make(Kind::array);
    v.array = std::make_shared<Array>(std::move(a));
    return v;
  }
  static Value of(Function f) {
    Value v = make(Kind::function);
    v.function = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value of(Object o, Kind kind = Kind::object);

  bool is_number() const { return kind == Kind::integer || kind == Kind::floating; }
  bool is_mapping() const { return kind == Kind::object || kind == Kind::ns; }
  bool nullish() const { return kind == Kind::none || kind == Kind::undefined; }
  double as_double() const {
    return kind == Kind::integer ? static_cast<double>(integer) : kind == Kind::boolean ? (boolean ? 1.0 : 0.0) : number;
  }
  bool truthy() const;

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

/// An insertion-ordered dict (JavaScript Map semantics).
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : entries) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(std::string key, Value v) {
    for (auto& [k, old] : entries) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    entries.emplace_back(std::move(key), std::move(v));
  }
};

Value Value::of(Object o, Kind kind) {
  Value v = make(kind);
  v.object = std::make_shared<Object>(std::move(o));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::undefined: case Kind::none: return false;
    case Kind::boolean: return boolean;
    case Kind::integer: return integer != 0;
    case Kind::floating: return number != 0 && !std::isnan(number);
    case Kind::string: return !str.empty();
    case Kind::array: return !array->empty();
    case Kind::object: return !object->entries.empty();
    case Kind::ns: case Kind::function: return true;
  }
  return false;
}

struct Args {
  std::vector<Value> positional;
  Object keyword;
  /// Positional argument i, else keyword `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const {
    if (i < positional.size()) return &positional[i];
    return keyword.find(name);
  }
};

const char* type_name(Kind k) {
  switch (k) {
    case Kind::undefined: return "UndefinedValue";
    case Kind::none: return "NullValue";
    case Kind::boolean: return "BooleanValue";
    case Kind::integer: return "IntegerValue";
    case Kind::floating: return "FloatValue";
    case Kind::string: return "StringValue";
    case Kind::array: return "ArrayValue";
    case Kind::object: return "ObjectValue";
    case Kind::ns: return "NamespaceValue";
    case Kind::function: return "FunctionValue";
  }
  return "?";
}

/// The JavaScript String(value) of a value's payload (what `~`, `+` and join use).
std::string js_string(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: case Kind::none: case Kind::function: return "";
    case Kind::boolean: return v.boolean ? "true" : "false";
    case Kind::integer: return std::to_string(v.integer);
    case Kind::floating: return js_number(v.number);
    case Kind::string: return v.str;
    case Kind::array: {
      std::string out;
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i) out += ",";
        out += js_string((*v.array)[i]);
      }
      return out;
    }
    case Kind::object: case Kind::ns: return "[object Map]";
  }
  return "";
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char buf[16];
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c >= 0x7F && c < kRawByte) {
          if (c < 0x10000) {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          } else {
            const char32_t u = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (u >> 10)),
                          static_cast<unsigned>(0xDC00 + (u & 0x3FF)));
          }
          out += buf;
        } else {
          append_utf8(out, c);
        }
      }
    }
  }
  return out + "\"";
}

struct JsonOptions {
  std::optional<int64_t> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
};

/// The `tojson` serialisation (JSON.stringify-like, Python's default separators).
std::string to_json(const Value& v, const JsonOptions& opt, int depth, bool undefined_to_null) {
  switch (v.kind) {
    case Kind::none: return "null";
    case Kind::undefined: return undefined_to_null ? "null" : "undefined";
    case Kind::boolean: return v.boolean ? "true" : "false";
    case Kind::integer: return std::to_string(v.integer);
    case Kind::floating: return std::isfinite(v.number) ? js_number(v.number) : "null";
    case Kind::string: return json_quote(v.str, opt.ensure_ascii);
    case Kind::function: fail("Cannot convert to JSON: FunctionValue");
    case Kind::array: case Kind::object: case Kind::ns: break;
  }
  const bool indented = opt.indent && *opt.indent > 0;
  std::string item_sep = indented ? "," : ", ", key_sep = ": ";
  if (opt.separators) std::tie(item_sep, key_sep) = *opt.separators;
  const std::string unit = indented ? std::string(*opt.indent, ' ') : "";
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += unit;
  const std::string child = base + unit;
  std::vector<std::string> core;
  if (v.kind == Kind::array) {
    for (const Value& x : *v.array) core.push_back(to_json(x, opt, depth + 1, undefined_to_null));
    std::string out = "[";
    if (indented && !core.empty()) {
      out += child;
      for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep + child : "") + core[i];
      return out + base + "]";
    }
    for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
    return out + "]";
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& e : v.object->entries) entries.push_back(&e);
  if (opt.sort_keys) {
    std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  }
  for (const auto* e : entries) {
    std::string item = json_quote(e->first, opt.ensure_ascii) + key_sep + to_json(e->second, opt, depth + 1, undefined_to_null);
    core.push_back(indented ? child + item : item);
  }
  std::string out = "{";
  for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
  return out + (indented && !core.empty() ? base : "") + "}";
}

/// How `{{ value }}` prints it.
std::string to_output(const Value& v) {
  switch (v.kind) {
    case Kind::floating:
      if (std::isfinite(v.number) && std::fmod(v.number, 1.0) == 0 && std::abs(v.number) < 1e21) {
        if (v.number == 0 && std::signbit(v.number)) return "-0.0";
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f", v.number);
        return buf;
      }
      return js_number(v.number);
    case Kind::array: case Kind::object: case Kind::ns: return to_json(v, {}, 0, false);
    default: return js_string(v);
  }
}

/// JavaScript's Number(string).
double js_to_number(std::string_view s) {
  const std::string t = trim(s, Trim::both);
  if (t.empty()) return 0.0;
  double d = 0;
  auto res = std::from_chars(t.data(), t.data() + t.size(), d);
  if (res.ec != std::errc() || res.ptr != t.data() + t.size()) return std::nan("");
  return d;
}

bool is_primitive(const Value& v) {
  return v.kind == Kind::boolean || v.is_number() || v.kind == Kind::string;
}

/// JavaScript `==` on the values' payloads (what the renderer's == and != do).
bool loose_equal(const Value& a, const Value& b) {
  if (a.nullish() || b.nullish()) return a.nullish() && b.nullish();
  if (!is_primitive(a) && !is_primitive(b)) {
    return a.kind == b.kind && a.array == b.array && a.object == b.object && a.function == b.function;
  }
  if (!is_primitive(a)) return loose_equal(Value::of(js_string(a)), b);
  if (!is_primitive(b)) return loose_equal(a, Value::of(js_string(b)));
  if (a.kind == Kind::string && b.kind == Kind::string) return a.str == b.str;
  const double x = a.kind == Kind::string ? js_to_number(a.str) : a.as_double();
  const double y = b.kind == Kind::string ? js_to_number(b.str) : b.as_double();
  return x == y;
}

/// JavaScript `===` on payloads (membership in a list).
bool strict_equal(const Value& a, const Value& b) {
  if (a.nullish() || b.nullish()) return a.nullish() && b.nullish();
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::boolean: return a.boolean == b.boolean;
    case Kind::string: return a.str == b.str;
    default: return a.array == b.array && a.object == b.object && a.function == b.function;
  }
}

Value from_json(const boost::json::value& j) {
  switch (j.kind()) {
    case boost::json::kind::null: return Value::none();
    case boost::json::kind::bool_: return Value::of(j.get_bool());
    case boost::json::kind::int64: return Value::of_int(j.get_int64());
    case boost::json::kind::uint64: return Value::of_int(static_cast<int64_t>(j.get_uint64()));
    case boost::json::kind::double_: {
      // JSON.parse does not keep 1.0 apart from 1: integral numbers are integers to the renderer.
      const double d = j.get_double();
      if (std::isfinite(d) && std::trunc(d) == d && std::abs(d) < 9007199254740992.0) {
        return Value::of_int(static_cast<int64_t>(d));
      }
      return Value::of_float(d);
    }
    case boost::json::kind::string: return Value::of(std::string(j.get_string()));
    case boost::json::kind::array: {
      Array a;
      for (const auto& x : j.get_array()) a.push_back(from_json(x));
      return Value::of(std::move(a));
    }
    case boost::json::kind::object: {
      Object o;
      for (const auto& kv : j.get_object()) o.set(std::string(kv.key()), from_json(kv.value()));
      return Value::of(std::move(o));
    }
  }
  return {};
}

// ---- lexer ----------------------------------------------------------------------------------------------------

enum class Tok {
  text, number, string, ident, equals, lparen, rparen, open_stmt, close_stmt, open_expr, close_expr, lbracket,
  rbracket, lbrace, rbrace, comma, dot, colon, pipe, additive, multiplicative, power, comparison, unary, comment
};

struct Token {
  Tok type;
  std::string value;
};

/// Whether a (JavaScript, multiline) line starts at `i`.
bool at_line_start(std::string_view s, size_t i) {
  if (i == 0) return true;
  const char p = s[i - 1];
  if (p == '\n' || p == '\r') return true;
  // U+2028 / U+2029 end lines for JavaScript's ^ too.
  return i >= 3 && s[i - 3] == '\xE2' && s[i - 2] == '\x80' && (s[i - 1] == '\xA8' || s[i - 1] == '\xA9');
}

/// The renderer's preprocessing: one trailing newline dropped, lstrip_blocks, trim_blocks, {% generation %} tags
/// removed.
std::string preprocess(std::string_view in) {
  std::string src(in);
  if (!src.empty() && src.back() == '\n') src.pop_back();
  // lstrip_blocks: spaces and tabs at the start of a line before "{%", "{#" or "{-" go.
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    if (at_line_start(src, i)) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j > i && j + 1 < src.size() && src[j] == '{' &&
          (src[j + 1] == '%' || src[j + 1] == '#' || src[j + 1] == '-')) {
        i = j;
      }
    }
    out.push_back(src[i++]);
  }
  // trim_blocks: the newline right after "%}", "#}" or "-}" goes.
  src.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    src.push_back(out[i]);
    if (out[i] == '}' && i > 0 && (out[i - 1] == '%' || out[i - 1] == '#' || out[i - 1] == '-') &&
        i + 1 < out.size() && out[i + 1] == '\n') {
      ++i;
    }
  }
  // {% generation %} / {% endgeneration %} markers vanish, with their whitespace control.
  out.clear();
  size_t i = 0;
  while (i < src.size()) {
    const size_t open = src.find("{%", i);
    if (open == std::string::npos) {
      out.append(src, i, std::string::npos);
      break;
    }
    size_t p = open + 2;
    const bool strip_before = p < src.size() && src[p] == '-';
    if (strip_before) ++p;
    while (p < src.size() && is_ascii_space(src[p])) ++p;
    if (src.compare(p, 3, "end") == 0) p += 3;
    bool is_generation = src.compare(p, 10, "generation") == 0;
    bool strip_after = false;
    if (is_generation) {
      p += 10;
      while (p < src.size() && is_ascii_space(src[p])) ++p;
      strip_after = p < src.size() && src[p] == '-';
      if (strip_after) ++p;
      is_generation = src.compare(p, 2, "%}") == 0;
    }
    if (!is_generation) {
      out.append(src, i, open + 2 - i);
      i = open + 2;
      continue;
    }
    size_t before = open;
    while (before > i && is_ascii_space(src[before - 1])) --before;
    out.append(src, i, (strip_before ? before : open) - i);
    p += 2;
    size_t after = p;
    while (after < src.size() && is_ascii_space(src[after])) ++after;
    if (!strip_after) out.append(src, p, after - p);
    i = after;
  }
  return out;
}

std::vector<Token> tokenize(std::string_view source) {
  const std::string src = preprocess(source);
  std::vector<Token> tokens;
  size_t pos = 0;
  int curly_depth = 0;
  auto last_type = [&]() -> std::optional<Tok> {
    if (tokens.empty()) return std::nullopt;
    return tokens.back().type;
  };
  auto strip_trailing_whitespace = [&] {
    if (!tokens.empty() && tokens.back().type == Tok::text) {
      tokens.back().value = trim(tokens.back().value, Trim::end);
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  };
  auto skip_leading_whitespace = [&] {
    while (pos < src.size()) {
      const std::u32string next = decode_utf8(std::string_view(src).substr(pos, 4));
      if (next.empty() || !is_js_space(next[0])) break;
      std::string one;
      append_utf8(one, next[0]);
      pos += one.size();
    }
  };
  // A string literal's characters up to (not including) `quote`, escapes resolved.
  auto read_string = [&](char quote) {
    std::string s;
    while (pos < src.size() && src[pos] != quote) {
      if (src[pos] == '\\') {
        if (++pos >= src.size()) fail("Unexpected end of input");
        const char e = src[pos++];
        if (e == 'x' || e == 'u') {
          const size_t n = e == 'x' ? 2 : 4;
          const std::string hex = src.substr(pos, n);
          unsigned cp = 0;
          auto res = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
          if (hex.size() != n || res.ptr != hex.data() + hex.size()) fail("Invalid hexadecimal escape sequence");
          append_utf8(s, cp);
          pos += n;
          continue;
        }
        switch (e) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'r': s += '\r'; break;
          case 'b': s += '\b'; break;
          case 'f': s += '\f'; break;
          case 'v': s += '\v'; break;
          case '\'': case '"': case '\\': s += e; break;
          default: fail(std::string("Unexpected escaped character: ") + e);
        }
        continue;
      }
      s += src[pos++];
    }
    if (pos >= src.size()) fail("Unexpected end of input");
    return s;
  };
  static const std::pair<std::string_view, Tok> kSymbols[] = {
      {"{%", Tok::open_stmt}, {"%}", Tok::close_stmt}, {"{{", Tok::open_expr}, {"}}", Tok::close_expr},
      {"(", Tok::lparen}, {")", Tok::rparen}, {"{", Tok::lbrace}, {"}", Tok::rbrace}, {"[", Tok::lbracket},
      {"]", Tok::rbracket}, {",", Tok::comma}, {".", Tok::dot}, {":", Tok::colon}, {"|", Tok::pipe},
      {"<=", Tok::comparison}, {">=", Tok::comparison}, {"==", Tok::comparison}, {"!=", Tok::comparison},
      {"<", Tok::comparison}, {">", Tok::comparison}, {"+", Tok::additive}, {"-", Tok::additive},
      {"~", Tok::additive}, {"**", Tok::power}, {"*", Tok::multiplicative}, {"//", Tok::multiplicative},
      {"/", Tok::multiplicative}, {"%", Tok::multiplicative}, {"=", Tok::equals}};

  while (pos < src.size()) {
    const auto lt = last_type();
    if (!lt || *lt == Tok::close_stmt || *lt == Tok::close_expr || *lt == Tok::comment) {
      size_t end = pos;
      while (end < src.size() &&
             !(src[end] == '{' && end + 1 < src.size() && (src[end + 1] == '%' || src[end + 1] == '{' || src[end + 1] == '#'))) {
        ++end;
      }
      if (end > pos) {
        tokens.push_back({Tok::text, src.substr(pos, end - pos)});
        pos = end;
        continue;
      }
    }
    if (src.compare(pos, 2, "{#") == 0) {
      pos += 2;
      const bool strip_before = pos < src.size() && src[pos] == '-';
      if (strip_before) ++pos;
      const size_t close = src.find("#}", pos);
      if (close == std::string::npos) fail("Missing end of comment tag");
      std::string comment = src.substr(pos, close - pos);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      tokens.push_back({Tok::comment, std::move(comment)});
      pos = close + 2;
      if (strip_after) skip_leading_whitespace();
      continue;
    }
    if (src.compare(pos, 3, "{%-") == 0 || src.compare(pos, 3, "{{-") == 0) {
      strip_trailing_whitespace();
      const bool stmt = src[pos + 1] == '%';
      tokens.push_back({stmt ? Tok::open_stmt : Tok::open_expr, stmt ? "{%" : "{{"});
      if (!stmt) curly_depth = 0;
      pos += 3;
      continue;
    }
    while (pos < src.size() && is_ascii_space(src[pos])) ++pos;
    if (pos >= src.size()) break;
    if (src.compare(pos, 3, "-%}") == 0 || src.compare(pos, 3, "-}}") == 0) {
      const bool stmt = src[pos + 1] == '%';
      tokens.push_back({stmt ? Tok::close_stmt : Tok::close_expr, stmt ? "%}" : "}}"});
      pos += 3;
      skip_leading_whitespace();
      continue;
    }
    const char c = src[pos];
    if (c == '-' || c == '+') {
      if (!lt || *lt == Tok::text) fail(std::string("Unexpected character: ") + c);
      if (*lt != Tok::ident && *lt != Tok::number && *lt != Tok::string && *lt != Tok::rparen && *lt != Tok::rbracket) {
        ++pos;
        std::string num;
        while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
        if (!num.empty() && pos + 1 < src.size() && src[pos] == '.' && is_digit(src[pos + 1])) {
          num += src[pos++];
          while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
        }
        tokens.push_back({num.empty() ? Tok::unary : Tok::number, std::string(1, c) + num});
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kSymbols) {
      if (seq == "}}" && curly_depth > 0) continue;
      if (src.compare(pos, seq.size(), seq) == 0) {
        tokens.push_back({type, std::string(seq)});
        if (type == Tok::open_expr) curly_depth = 0;
        if (type == Tok::lbrace) ++curly_depth;
        if (type == Tok::rbrace) --curly_depth;
        pos += seq.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      ++pos;
      tokens.push_back({Tok::string, read_string(c)});
      ++pos;
      continue;
    }
    if (is_digit(c)) {
      std::string num;
      while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
      if (!(lt && *lt == Tok::dot) && pos + 1 < src.size() && src[pos] == '.' && is_digit(src[pos + 1])) {
        num += src[pos++];
        while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
      }
      tokens.push_back({Tok::number, std::move(num)});
      continue;
    }
    if (is_word_char(c)) {
      std::string word;
      while (pos < src.size() && is_word_char(src[pos])) word += src[pos++];
      tokens.push_back({Tok::ident, std::move(word)});
      continue;
    }
    fail(std::string("Unexpected character: ") + c);
  }
  return tokens;
}

// ---- syntax tree and parser -----------------------------------------------------------------------------------

enum class NodeKind {
  // statements
  set, if_, for_, macro, break_, continue_, comment,
  // expressions
  literal, identifier, array, tuple, object, member, slice, call, kwarg, filter, test, unary, binary, ternary, select
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

/// One node of the tree; which fields mean what depends on `kind`:
///   literal: value | identifier: text | array, tuple: list | object: pairs | kwarg: text = a
///   member: a[b] (flag: computed; b is a literal name when not) | slice: a:b:c (each may be null)
///   call: a(list) | filter: a | b (b an identifier or a call) | test: a is [not: flag] text
///   unary: text a | binary: a text b | ternary: b if a else c | select: a if b
///   set: a = b, or a = body when b is null | if: a, body, alternate | for: a in b, body, alternate (else)
///   macro: text(list) body | comment: nothing
struct Node {
  NodeKind kind;
  Value value;
  std::string text;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> list, body, alternate;
  std::vector<std::pair<NodePtr, NodePtr>> pairs;
};

NodePtr make(NodeKind kind) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  return n;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::vector<NodePtr> parse_program() {
    std::vector<NodePtr> body;
    while (cur_ < tokens_.size()) body.push_back(parse_any());
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    if (cur_ + ahead >= tokens_.size()) fail("Unexpected end of template");
    return tokens_[cur_ + ahead];
  }
  bool is(Tok t) const { return cur_ < tokens_.size() && tokens_[cur_].type == t; }
  bool is_ident(std::string_view name, size_t ahead = 0) const {
    return cur_ + ahead < tokens_.size() && tokens_[cur_ + ahead].type == Tok::ident && tokens_[cur_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!(is(Tok::open_stmt) && cur_ + 1 < tokens_.size() && tokens_[cur_ + 1].type == Tok::ident)) return false;
    for (auto n : names) {
      if (tokens_[cur_ + 1].value == n) return true;
    }
    return false;
  }
  const Token& expect(Tok t, const char* what) {
    const Token& tok = peek();
    if (tok.type != t) fail(std::string("Parser Error: expected ") + what + ", got '" + tok.value + "'");
    ++cur_;
    return tok;
  }
  void expect_ident(std::string_view name) {
    if (!is_ident(name)) fail("Expected " + std::string(name));
    ++cur_;
  }
  void expect_end(std::string_view name) {
    expect(Tok::open_stmt, "{%");
    expect_ident(name);
    expect(Tok::close_stmt, "%}");
  }

  NodePtr parse_any() {
    const Token& t = peek();
    switch (t.type) {
      case Tok::comment: ++cur_; return make(NodeKind::comment);
      case Tok::text: {
        auto n = make(NodeKind::literal);
        n->value = Value::of(t.value);
        ++cur_;
        return n;
      }
      case Tok::open_stmt: return parse_statement();
      case Tok::open_expr: {
        ++cur_;
        auto e = parse_expression();
        expect(Tok::close_expr, "}}");
        return e;
      }
      default: fail("Unexpected token '" + t.value + "'");
    }
  }

  std::vector<NodePtr> parse_until(std::initializer_list<std::string_view> ends) {
    std::vector<NodePtr> body;
    while (!is_statement(ends)) body.push_back(parse_any());
    return body;
  }

  NodePtr parse_statement() {
    expect(Tok::open_stmt, "{%");
    const Token& t = peek();
    if (t.type != Tok::ident) fail("Unknown statement '" + t.value + "'");
    const std::string name = t.value;
    ++cur_;
    if (name == "set") return parse_set();
    if (name == "if") {
      auto n = parse_if();
      expect_end("endif");
      return n;
    }
    if (name == "for") {
      auto n = parse_for();
      expect_end("endfor");
      return n;
    }
    if (name == "macro") {
      auto n = make(NodeKind::macro);
      const Token& id = expect(Tok::ident, "a macro name");
      n->text = id.value;
      n->list = parse_args();
      expect(Tok::close_stmt, "%}");
      n->body = parse_until({"endmacro"});
      expect_end("endmacro");
      return n;
    }
    if (name == "break" || name == "continue") {
      expect(Tok::close_stmt, "%}");
      return make(name == "break" ? NodeKind::break_ : NodeKind::continue_);
    }
    fail("Unknown statement type: " + name);
  }

  NodePtr parse_set() {
    auto n = make(NodeKind::set);
    n->a = parse_sequence(false);
    if (is(Tok::equals)) {
      ++cur_;
      n->b = parse_sequence(false);
    } else {
      expect(Tok::close_stmt, "%}");
      n->body = parse_until({"endset"});
      expect(Tok::open_stmt, "{%");
      expect_ident("endset");
    }
    expect(Tok::close_stmt, "%}");
    return n;
  }

  NodePtr parse_if() {
    auto n = make(NodeKind::if_);
    n->a = parse_expression();
    expect(Tok::close_stmt, "%}");
    n->body = parse_until({"elif", "else", "endif"});
    if (is_statement({"elif"})) {
      cur_ += 2;
      n->alternate.push_back(parse_if());
    } else if (is_statement({"else"})) {
      cur_ += 2;
      expect(Tok::close_stmt, "%}");
      n->alternate = parse_until({"endif"});
    }
    return n;
  }

  NodePtr parse_for() {
    auto n = make(NodeKind::for_);
    n->a = parse_sequence(true);
    if (n->a->kind != NodeKind::identifier && n->a->kind != NodeKind::tuple) {
      fail("Expected identifier/tuple for the loop variable");
    }
    expect_ident("in");
    n->b = parse_expression();
    expect(Tok::close_stmt, "%}");
    n->body = parse_until({"endfor", "else"});
    if (is_statement({"else"})) {
      cur_ += 2;
      expect(Tok::close_stmt, "%}");
      n->alternate = parse_until({"endfor"});
    }
    return n;
  }

  NodePtr parse_sequence(bool primary) {
    auto first = primary ? parse_primary() : parse_expression();
    if (!is(Tok::comma)) return first;
    auto tuple = make(NodeKind::tuple);
    tuple->list.push_back(std::move(first));
    while (is(Tok::comma)) {
      ++cur_;
      tuple->list.push_back(primary ? parse_primary() : parse_expression());
    }
    return tuple;
  }

  NodePtr parse_expression() {
    auto a = parse_or();
    if (!is_ident("if")) return a;
    ++cur_;
    auto test = parse_or();
    if (is_ident("else")) {
      ++cur_;
      auto n = make(NodeKind::ternary);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = parse_expression();
      return n;
    }
    auto n = make(NodeKind::select);
    n->a = std::move(a);
    n->b = std::move(test);
    return n;
  }

  NodePtr binary(std::string op, NodePtr left, NodePtr right) {
    auto n = make(NodeKind::binary);
    n->text = std::move(op);
    n->a = std::move(left);
    n->b = std::move(right);
    return n;
  }

  NodePtr parse_or() {
    auto left = parse_and();
    while (is_ident("or")) {
      ++cur_;
      left = binary("or", std::move(left), parse_and());
    }
    return left;
  }
  NodePtr parse_and() {
    auto left = parse_not();
    while (is_ident("and")) {
      ++cur_;
      left = binary("and", std::move(left), parse_not());
    }
    return left;
  }
  NodePtr parse_not() {
    if (!is_ident("not")) return parse_comparison();
    ++cur_;
    auto n = make(NodeKind::unary);
    n->text = "not";
    n->a = parse_not();
    return n;
  }
  NodePtr parse_comparison() {
    auto left = parse_additive();
    while (true) {
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (is_ident("in") || is(Tok::comparison)) {
        op = tokens_[cur_++].value;
      } else {
        return left;
      }
      left = binary(op, std::move(left), parse_additive());
    }
  }
  NodePtr parse_additive() {
    auto left = parse_multiplicative();
    while (is(Tok::additive)) {
      std::string op = tokens_[cur_++].value;
      left = binary(op, std::move(left), parse_multiplicative());
    }
    return left;
  }
  NodePtr parse_multiplicative() {
    auto left = parse_power();
    while (is(Tok::multiplicative)) {
      std::string op = tokens_[cur_++].value;
      left = binary(op, std::move(left), parse_power());
    }
    return left;
  }
  NodePtr parse_power() {
    auto left = parse_test();
    while (is(Tok::power)) {
      ++cur_;
      left = binary("**", std::move(left), parse_test());
    }
    return left;
  }
  NodePtr parse_test() {
    auto operand = parse_filter();
    while (is_ident("is")) {
      ++cur_;
      auto n = make(NodeKind::test);
      n->flag = is_ident("not");
      if (n->flag) ++cur_;
      n->text = expect(Tok::ident, "a test name").value;
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr parse_filter() {
    auto operand = parse_unary_sign();
    while (is(Tok::pipe)) {
      ++cur_;
      auto filter = make(NodeKind::identifier);
      filter->text = expect(Tok::ident, "a filter name").value;
      if (is(Tok::lparen)) filter = parse_call(std::move(filter));
      auto n = make(NodeKind::filter);
      n->a = std::move(operand);
      n->b = std::move(filter);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr parse_unary_sign() {
    if (cur_ < tokens_.size() && (is(Tok::unary) || is(Tok::additive)) &&
        (tokens_[cur_].value == "-" || tokens_[cur_].value == "+")) {
      auto n = make(NodeKind::unary);
      n->text = tokens_[cur_++].value;
      n->a = parse_unary_sign();
      return n;
    }
    auto member = parse_member(parse_primary());
    return is(Tok::lparen) ? parse_call(std::move(member)) : std::move(member);
  }
  NodePtr parse_call(NodePtr callee) {
    auto n = make(NodeKind::call);
    n->a = std::move(callee);
    n->list = parse_args();
    auto expr = parse_member(std::move(n));
    return is(Tok::lparen) ? parse_call(std::move(expr)) : std::move(expr);
  }
  std::vector<NodePtr> parse_args() {
    expect(Tok::lparen, "(");
    std::vector<NodePtr> args;
    bool saw_keyword = false;
    while (!is(Tok::rparen)) {
      auto arg = parse_expression();
      if (is(Tok::equals)) {
        ++cur_;
        if (arg->kind != NodeKind::identifier) fail("Expected identifier for keyword argument");
        auto kw = make(NodeKind::kwarg);
        kw->text = arg->text;
        kw->a = parse_expression();
        arg = std::move(kw);
        saw_keyword = true;
      } else if (saw_keyword) {
        fail("Positional arguments must come before keyword arguments");
      }
      args.push_back(std::move(arg));
      if (is(Tok::comma)) ++cur_;
    }
    ++cur_;
    return args;
  }
  NodePtr parse_member(NodePtr object) {
    while (is(Tok::dot) || is(Tok::lbracket)) {
      const bool computed = is(Tok::lbracket);
      ++cur_;
      auto n = make(NodeKind::member);
      n->flag = computed;
      n->a = std::move(object);
      if (computed) {
        n->b = parse_subscript();
        expect(Tok::rbracket, "]");
      } else {
        n->b = parse_primary();
        if (n->b->kind != NodeKind::identifier &&
            !(n->b->kind == NodeKind::literal && n->b->value.kind == Kind::integer)) {
          fail("Expected identifier or integer following dot operator");
        }
      }
      object = std::move(n);
    }
    return object;
  }
  NodePtr parse_subscript() {
    std::vector<NodePtr> parts;
    bool is_slice = false;
    while (!is(Tok::rbracket)) {
      if (is(Tok::colon)) {
        parts.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(Tok::colon)) {
          ++cur_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) fail("Expected at least one argument for member/slice expression");
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) fail("Expected 0-3 arguments for slice expression");
    auto n = make(NodeKind::slice);
    parts.resize(3);
    n->a = std::move(parts[0]);
    n->b = std::move(parts[1]);
    n->c = std::move(parts[2]);
    return n;
  }
  NodePtr parse_primary() {
    const Token& t = peek();
    ++cur_;
    switch (t.type) {
      case Tok::number: {
        auto n = make(NodeKind::literal);
        if (t.value.find('.') != std::string::npos) {
          n->value = Value::of_float(std::stod(t.value));
        } else {
          n->value = Value::of_int(std::stoll(t.value));
        }
        return n;
      }
      case Tok::string: {
        std::string s = t.value;
        while (is(Tok::string)) s += tokens_[cur_++].value;
        auto n = make(NodeKind::literal);
        n->value = Value::of(std::move(s));
        return n;
      }
      case Tok::ident: {
        auto n = make(NodeKind::identifier);
        n->text = t.value;
        return n;
      }
      case Tok::lparen: {
        auto e = parse_sequence(false);
        expect(Tok::rparen, ")");
        return e;
      }
      case Tok::lbracket: {
        auto n = make(NodeKind::array);
        while (!is(Tok::rbracket)) {
          n->list.push_back(parse_expression());
          if (is(Tok::comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      case Tok::lbrace: {
        auto n = make(NodeKind::object);
        while (!is(Tok::rbrace)) {
          auto key = parse_expression();
          expect(Tok::colon, ":");
          n->pairs.emplace_back(std::move(key), parse_expression());
          if (is(Tok::comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      default: fail("Unexpected token '" + t.value + "'");
    }
  }

  std::vector<Token> tokens_;
  size_t cur_ = 0;
};

// ---- interpreter ----------------------------------------------------------------------------------------------

struct Scope {
  explicit Scope(Scope* parent_scope = nullptr) : parent(parent_scope) {}
  Scope* parent;
  Object vars;
  Value lookup(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent) {
      if (const Value* v = s->vars.find(name)) return *v;
    }
    return {};
  }
};

struct BreakSignal {};
struct ContinueSignal {};

/// Python's str.strip/lstrip/rstrip: `chars` (a string) or whitespace when absent or none.
Value strip_method(const std::string& s, Args& args, Trim where) {
  const Value* chars = args.get(0, "chars");
  if (!chars || chars->nullish()) return Value::of(trim(s, where));
  if (chars->kind != Kind::string) fail("strip arg must be None or str");
  const std::u32string set = decode_utf8(chars->str);
  return Value::of(trim(s, where, &set));
}

Value split_method(const std::string& s, Args& args) {
  const Value* sep = args.get(0, "sep");
  const Value* maxsplit_v = args.get(1, "maxsplit");
  const int64_t maxsplit = maxsplit_v ? maxsplit_v->integer : -1;
  if (maxsplit_v && maxsplit_v->kind != Kind::integer) fail("maxsplit argument must be a number");
  Array parts;
  if (!sep || sep->nullish()) {
    const std::u32string text = decode_utf8(trim(s, Trim::start));
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i;
      while (j < text.size() && !is_js_space(text[j])) ++j;
      if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(Value::of(encode_utf8(std::u32string_view(text).substr(i))));
        break;
      }
      parts.push_back(Value::of(encode_utf8(std::u32string_view(text).substr(i, j - i))));
      i = j;
      while (i < text.size() && is_js_space(text[i])) ++i;
    }
    return Value::of(std::move(parts));
  }
  if (sep->kind != Kind::string) fail("sep argument must be a string or null");
  if (sep->str.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      parts.push_back(Value::of(s.substr(start)));
      break;
    }
    const size_t at = s.find(sep->str, start);
    if (at == std::string::npos) {
      parts.push_back(Value::of(s.substr(start)));
      break;
    }
    parts.push_back(Value::of(s.substr(start, at - start)));
    start = at + sep->str.size();
  }
  return Value::of(std::move(parts));
}

std::string replace_all(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  if (count == 0) return s;
  int64_t remaining = count < 0 ? std::numeric_limits<int64_t>::max() : count;
  std::string out;
  if (old.empty()) {
    const std::u32string cps = decode_utf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (remaining > 0) {
        out += with;
        --remaining;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  while (remaining > 0) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += with;
    start = at + old.size();
    --remaining;
  }
  return out + s.substr(start);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}

std::string title_case(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (is_word_char(s[i]) && (i == 0 || !is_word_char(s[i - 1])) && s[i] >= 'a' && s[i] <= 'z') s[i] -= 32;
  }
  return s;
}

/// A string's methods and `length` (str.upper(), "x".startswith(...), ...); undefined for unknown names.
Value string_builtin(const std::string& s, std::string_view name) {
  auto method = [&](auto f) { return Value::of(Function([s, f](Args& a, Scope&) { return f(s, a); })); };
  if (name == "length") return Value::of_int(js_length(s));
  if (name == "upper") return method([](const std::string& x, Args&) { return Value::of(ascii_case(x, true)); });
  if (name == "lower") return method([](const std::string& x, Args&) { return Value::of(ascii_case(x, false)); });
  if (name == "title") return method([](const std::string& x, Args&) { return Value::of(title_case(x)); });
  if (name == "capitalize") {
    return method([](const std::string& x, Args&) {
      std::string r = x;
      if (!r.empty() && r[0] >= 'a' && r[0] <= 'z') r[0] -= 32;
      return Value::of(r);
    });
  }
  if (name == "strip") return method([](const std::string& x, Args& a) { return strip_method(x, a, Trim::both); });
  if (name == "lstrip") return method([](const std::string& x, Args& a) { return strip_method(x, a, Trim::start); });
  if (name == "rstrip") return method([](const std::string& x, Args& a) { return strip_method(x, a, Trim::end); });
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method([start](const std::string& x, Args& a) {
      if (a.positional.empty()) fail("startswith()/endswith() requires at least one argument");
      auto test = [&](const Value& p) {
        if (p.kind != Kind::string) fail("startswith()/endswith() argument must be a string or tuple of strings");
        const std::string& q = p.str;
        return q.size() <= x.size() && (start ? x.compare(0, q.size(), q) == 0 : x.compare(x.size() - q.size(), q.size(), q) == 0);
      };
      const Value& p = a.positional[0];
      if (p.kind == Kind::array) {
        for (const Value& item : *p.array) {
          if (test(item)) return Value::of(true);
        }
        return Value::of(false);
      }
      return Value::of(test(p));
    });
  }
  if (name == "split") return method([](const std::string& x, Args& a) { return split_method(x, a); });
  if (name == "replace") {
    return method([](const std::string& x, Args& a) {
      if (a.positional.size() < 2) fail("replace() requires at least two arguments");
      const Value& old = a.positional[0];
      const Value& with = a.positional[1];
      if (old.kind != Kind::string || with.kind != Kind::string) fail("replace() arguments must be strings");
      const Value* count = a.get(2, "count");
      if (count && !count->nullish() && count->kind != Kind::integer) fail("replace() count argument must be a number or null");
      return Value::of(replace_all(x, old.str, with.str, count && count->kind == Kind::integer ? count->integer : -1));
    });
  }
  return {};
}

Array object_items(const Object& o) {
  Array items;
  for (const auto& [k, v] : o.entries) items.push_back(Value::of(Array{Value::of(k), v}));
  return items;
}

/// A dict's methods (get, items, keys, values); undefined for unknown names.
Value object_builtin(const std::shared_ptr<Object>& o, std::string_view name) {
  if (name == "get") {
    return Value::of(Function([o](Args& a, Scope&) {
      if (a.positional.empty() || a.positional[0].kind != Kind::string) fail("Object key must be a string");
      if (const Value* v = o->find(a.positional[0].str)) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    }));
  }
  if (name == "items") return Value::of(Function([o](Args&, Scope&) { return Value::of(object_items(*o)); }));
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return Value::of(Function([o, keys](Args&, Scope&) {
      Array out;
      for (const auto& [k, v] : o->entries) out.push_back(keys ? Value::of(k) : v);
      return Value::of(std::move(out));
    }));
  }
  return {};
}

/// Python-style slice of n elements: the selected indices.
std::vector<size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t step = step_v.kind == Kind::integer ? step_v.integer : 1;
  if (step == 0) fail("slice step cannot be zero");
  int64_t start, stop;
  if (step > 0) {
    start = start_v.kind == Kind::integer ? start_v.integer : 0;
    stop = stop_v.kind == Kind::integer ? stop_v.integer : n;
    start = start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
  } else {
    start = start_v.kind == Kind::integer ? start_v.integer : n - 1;
    stop = stop_v.kind == Kind::integer ? stop_v.integer : -1;
    start = start < 0 ? std::max<int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
  }
  std::vector<size_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(static_cast<size_t>(i));
  return idx;
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.nullish() || b.nullish()) {
    if (a.kind == b.kind) return 0;
    fail(std::string("Cannot compare ") + type_name(a.kind) + " with " + type_name(b.kind));
  }
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind == Kind::boolean; };
  if (numeric(a) && numeric(b)) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind != b.kind || a.kind != Kind::string) {
    fail(std::string("Cannot compare ") + type_name(a.kind) + " with " + type_name(b.kind));
  }
  const std::string x = case_sensitive ? a.str : ascii_case(a.str, false);
  const std::string y = case_sensitive ? b.str : ascii_case(b.str, false);
  return x < y ? -1 : x > y ? 1 : 0;
}

/// A dotted attribute path of a dict/list ("a.b.0"), for the sort/map filters.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_mapping()) {
      const Value* f = v.object->find(part);
      v = f ? *f : Value{};
    } else if (v.kind == Kind::array) {
      char* end = nullptr;
      const long idx = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || idx < 0 || static_cast<size_t>(idx) >= v.array->size()) return {};
      v = (*v.array)[idx];
    } else {
      return {};
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

/// `v is name`; `arg` is the compared value of the two-argument tests (equalto/eq, through selectattr).
bool run_test(const std::string& name, const Value& v, const Value* arg = nullptr) {
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "callable") return v.kind == Kind::function;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::integer) fail("cannot " + name + " on " + type_name(v.kind));
    return (v.integer % 2 != 0) == (name == "odd");
  }
  if (name == "false") return v.kind == Kind::boolean && !v.boolean;
  if (name == "true") return v.kind == Kind::boolean && v.boolean;
  if (name == "none") return v.kind == Kind::none;
  if (name == "string") return v.kind == Kind::string;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "iterable") return v.kind == Kind::array || v.kind == Kind::string;
  if (name == "mapping") return v.kind == Kind::object;
  if (name == "sequence") return v.kind == Kind::array || v.kind == Kind::object || v.kind == Kind::string;
  if (name == "lower") return v.kind == Kind::string && v.str == ascii_case(v.str, false);
  if (name == "upper") return v.kind == Kind::string && v.str == ascii_case(v.str, true);
  if (name == "defined") return v.kind != Kind::undefined;
  if (name == "undefined") return v.kind == Kind::undefined;
  if (name == "equalto" || name == "eq") return arg && strict_equal(v, *arg);
  fail("Unknown test: " + name);
}

class Interpreter {
 public:
  /// Renders `program`; a break or continue outside a loop is an error.
  std::string render(const std::vector<NodePtr>& program, Scope& global) {
    std::string out;
    try {
      exec(program, global, out);
    } catch (const BreakSignal&) {
      fail("break outside a loop");
    } catch (const ContinueSignal&) {
      fail("continue outside a loop");
    }
    return out;
  }

 private:
  /// Runs statements, appending their output to `out` (output made before a break/continue stays, as in Python;
  /// the JavaScript renderer drops it).
  void exec(const std::vector<NodePtr>& statements, Scope& scope, std::string& out) {
    for (const auto& s : statements) {
      switch (s->kind) {
        case NodeKind::comment: break;
        case NodeKind::break_: throw BreakSignal{};
        case NodeKind::continue_: throw ContinueSignal{};
        case NodeKind::set: exec_set(*s, scope); break;
        case NodeKind::macro: define_macro(*s, scope); break;
        case NodeKind::if_: exec(eval(*s->a, scope).truthy() ? s->body : s->alternate, scope, out); break;
        case NodeKind::for_: exec_for(*s, scope, out); break;
        default: {
          const Value v = eval(*s, scope);
          if (!v.nullish()) out += to_output(v);
        }
      }
    }
  }

  Value eval(const Node& n, Scope& scope) {
    switch (n.kind) {
      case NodeKind::literal: return n.value;
      case NodeKind::identifier: return scope.lookup(n.text);
      case NodeKind::array: case NodeKind::tuple: {
        Array items;
        for (const auto& x : n.list) items.push_back(eval(*x, scope));
        return Value::of(std::move(items));
      }
      case NodeKind::object: {
        Object o;
        for (const auto& [k, v] : n.pairs) {
          Value key = eval(*k, scope);
          if (key.kind != Kind::string) fail(std::string("Object keys must be strings: got ") + type_name(key.kind));
          o.set(key.str, eval(*v, scope));
        }
        return Value::of(std::move(o));
      }
      case NodeKind::member: return eval_member(n, scope);
      case NodeKind::call: {
        Args args = eval_args(n.list, scope);
        const Value fn = eval(*n.a, scope);
        if (fn.kind != Kind::function) fail(std::string("Cannot call something that is not a function: got ") + type_name(fn.kind));
        return (*fn.function)(args, scope);
      }
      case NodeKind::filter: return apply_filter(eval(*n.a, scope), *n.b, scope);
      case NodeKind::test: return Value::of(run_test(n.text, eval(*n.a, scope)) != n.flag);
      case NodeKind::unary: return eval_unary(n, scope);
      case NodeKind::binary: return eval_binary(n, scope);
      case NodeKind::ternary: return eval(*n.a, scope).truthy() ? eval(*n.b, scope) : eval(*n.c, scope);
      case NodeKind::select: return eval(*n.b, scope).truthy() ? eval(*n.a, scope) : Value{};
      default: fail("Unexpected expression");
    }
  }

  Args eval_args(const std::vector<NodePtr>& list, Scope& scope) {
    Args args;
    for (const auto& a : list) {
      if (a->kind != NodeKind::kwarg) args.positional.push_back(eval(*a, scope));
    }
    for (const auto& a : list) {
      if (a->kind != NodeKind::kwarg) continue;
      if (args.keyword.find(a->text)) fail("Got multiple values for keyword argument '" + a->text + "'");
      args.keyword.set(a->text, eval(*a->a, scope));
    }
    return args;
  }

  void exec_set(const Node& n, Scope& scope) {
    Value rhs;
    if (n.b) {
      rhs = eval(*n.b, scope);
    } else {
      std::string body;
      exec(n.body, scope, body);
      rhs = Value::of(std::move(body));
    }
    const Node& target = *n.a;
    if (target.kind == NodeKind::identifier) {
      scope.vars.set(target.text, std::move(rhs));
    } else if (target.kind == NodeKind::tuple) {
      if (rhs.kind != Kind::array) fail(std::string("Cannot unpack non-iterable type in set: ") + type_name(rhs.kind));
      if (rhs.array->size() != target.list.size()) fail("Wrong number of items to unpack in set");
      for (size_t i = 0; i < target.list.size(); ++i) {
        if (target.list[i]->kind != NodeKind::identifier) fail("Cannot unpack to non-identifier in set");
        scope.vars.set(target.list[i]->text, (*rhs.array)[i]);
      }
    } else if (target.kind == NodeKind::member && !target.flag) {
      const Value object = eval(*target.a, scope);
      if (object.kind != Kind::ns) fail("cannot assign attribute on non-namespace object");
      if (target.b->kind != NodeKind::identifier) fail("Cannot assign to member with non-identifier property");
      object.object->set(target.b->text, std::move(rhs));
    } else {
      fail("Invalid left-hand side of an assignment");
    }
  }

  void exec_for(const Node& n, Scope& outer, std::string& out) {
    Scope scope(&outer);
    const Node* filter = nullptr;
    Value iterable;
    if (n.b->kind == NodeKind::select) {
      iterable = eval(*n.b->a, scope);
      filter = n.b->b.get();
    } else {
      iterable = eval(*n.b, scope);
    }
    if (iterable.kind == Kind::object) {
      Array keys;
      for (const auto& [k, v] : iterable.object->entries) keys.push_back(Value::of(k));
      iterable = Value::of(std::move(keys));
    }
    if (iterable.kind != Kind::array) {
      fail(std::string("Expected iterable or object type in for loop: got ") + type_name(iterable.kind));
    }
    const Node& target = *n.a;
    auto bind = [&](Scope& s, const Value& item) {
      if (target.kind == NodeKind::identifier) {
        s.vars.set(target.text, item);
        return;
      }
      if (item.kind != Kind::array) fail(std::string("Cannot unpack non-iterable type: ") + type_name(item.kind));
      if (item.array->size() != target.list.size()) fail("Wrong number of items to unpack");
      for (size_t j = 0; j < target.list.size(); ++j) {
        if (target.list[j]->kind != NodeKind::identifier) fail("Cannot unpack non-identifier type");
        s.vars.set(target.list[j]->text, (*item.array)[j]);
      }
    };
    std::vector<Value> items;
    for (const Value& item : *iterable.array) {
      if (filter) {
        Scope test_scope(&scope);
        bind(test_scope, item);
        if (!eval(*filter, test_scope).truthy()) continue;
      }
      items.push_back(item);
    }
    const auto count = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < count; ++i) {
      Object loop;
      loop.set("index", Value::of_int(i + 1));
      loop.set("index0", Value::of_int(i));
      loop.set("revindex", Value::of_int(count - i));
      loop.set("revindex0", Value::of_int(count - i - 1));
      loop.set("first", Value::of(i == 0));
      loop.set("last", Value::of(i == count - 1));
      loop.set("length", Value::of_int(count));
      loop.set("previtem", i > 0 ? items[i - 1] : Value{});
      loop.set("nextitem", i < count - 1 ? items[i + 1] : Value{});
      scope.vars.set("loop", Value::of(std::move(loop)));
      bind(scope, items[i]);
      try {
        exec(n.body, scope, out);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
    }
    if (count == 0) exec(n.alternate, scope, out);
  }

  void define_macro(const Node& n, Scope& scope) {
    const Node* macro = &n;
    scope.vars.set(n.text, Value::of(Function([this, macro](Args& args, Scope& caller) {
      Scope local(&caller);
      std::vector<std::pair<std::string, const Node*>> defaults;
      for (size_t i = 0; i < macro->list.size(); ++i) {
        const Node& param = *macro->list[i];
        const std::string& name = param.text;
        const Value* v = i < args.positional.size() ? &args.positional[i] : args.keyword.find(name);
        if (v) {
          local.vars.set(name, *v);
        } else {
          local.vars.set(name, Value{});
          if (param.kind == NodeKind::kwarg) defaults.emplace_back(name, param.a.get());
        }
      }
      for (const auto& [k, v] : args.keyword.entries) {
        bool known = false;
        for (const auto& p : macro->list) known = known || p->text == k;
        if (!known) fail("macro '" + macro->text + "' takes no keyword argument '" + k + "'");
      }
      if (args.positional.size() > macro->list.size()) {
        fail("macro '" + macro->text + "' takes not more than " + std::to_string(macro->list.size()) + " argument(s)");
      }
      for (const auto& [name, expr] : defaults) local.vars.set(name, eval(*expr, local));
      std::string out;
      exec(macro->body, local, out);
      return Value::of(std::move(out));
    })));
  }

  Value eval_member(const Node& n, Scope& scope) {
    const Value object = eval(*n.a, scope);
    if (n.flag && n.b->kind == NodeKind::slice) {
      const Node& s = *n.b;
      const Value start = s.a ? eval(*s.a, scope) : Value{};
      const Value stop = s.b ? eval(*s.b, scope) : Value{};
      const Value step = s.c ? eval(*s.c, scope) : Value{};
      for (const Value* v : {&start, &stop, &step}) {
        if (v->kind != Kind::integer && v->kind != Kind::undefined) fail("Slice indices must be integers or undefined");
      }
      if (object.kind == Kind::array) {
        Array out;
        for (size_t i : slice_indices(static_cast<int64_t>(object.array->size()), start, stop, step)) out.push_back((*object.array)[i]);
        return Value::of(std::move(out));
      }
      if (object.kind == Kind::string) {
        const std::u32string cps = decode_utf8(object.str);
        std::u32string out;
        for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step)) out.push_back(cps[i]);
        return Value::of(encode_utf8(out));
      }
      fail("Slice object must be an array or string");
    }
    const Value property = n.flag ? eval(*n.b, scope) : n.b->kind == NodeKind::literal ? n.b->value : Value::of(n.b->text);
    if (object.is_mapping()) {
      if (property.kind != Kind::string) fail(std::string("Cannot access property with non-string: got ") + type_name(property.kind));
      if (const Value* v = object.object->find(property.str)) return *v;
      return object.kind == Kind::object ? object_builtin(object.object, property.str) : Value{};
    }
    if (object.kind == Kind::array || object.kind == Kind::string) {
      if (property.kind == Kind::integer) {
        if (object.kind == Kind::array) {
          const auto size = static_cast<int64_t>(object.array->size());
          const int64_t i = property.integer < 0 ? size + property.integer : property.integer;
          return i >= 0 && i < size ? (*object.array)[i] : Value{};
        }
        const std::u32string cps = decode_utf8(object.str);
        const auto size = static_cast<int64_t>(cps.size());
        const int64_t i = property.integer < 0 ? size + property.integer : property.integer;
        return i >= 0 && i < size ? Value::of(encode_utf8(cps.substr(i, 1))) : Value{};
      }
      if (property.kind != Kind::string) fail("Cannot access property with non-string/non-number");
      if (object.kind == Kind::array) return property.str == "length" ? Value::of_int(static_cast<int64_t>(object.array->size())) : Value{};
      return string_builtin(object.str, property.str);
    }
    if (property.kind != Kind::string) fail(std::string("Cannot access property with non-string: got ") + type_name(property.kind));
    return {};
  }

  Value eval_unary(const Node& n, Scope& scope) {
    const Value v = eval(*n.a, scope);
    if (n.text == "not") return Value::of(!v.truthy());
    const int sign = n.text == "-" ? -1 : 1;
    if (v.kind == Kind::floating) return Value::of_float(sign * v.number);
    if (v.kind == Kind::integer || v.kind == Kind::boolean) return Value::of_int(sign * static_cast<int64_t>(v.as_double()));
    fail("Unknown operator \"" + n.text + "\" for " + type_name(v.kind));
  }

  Value eval_binary(const Node& n, Scope& scope) {
    const std::string& op = n.text;
    Value left = eval(*n.a, scope);
    if (op == "and") return left.truthy() ? eval(*n.b, scope) : left;
    if (op == "or") return left.truthy() ? left : eval(*n.b, scope);
    Value right = eval(*n.b, scope);
    if (op == "==") return Value::of(loose_equal(left, right));
    if (op == "!=") return Value::of(!loose_equal(left, right));
    if (left.kind == Kind::undefined || right.kind == Kind::undefined) {
      if (right.kind == Kind::undefined && (op == "in" || op == "not in")) return Value::of(op == "not in");
      fail("Cannot perform operation " + op + " on undefined values");
    }
    if (left.kind == Kind::none || right.kind == Kind::none) fail("Cannot perform operation on null values");
    if (op == "~") return Value::of(js_string(left) + js_string(right));
    const auto numeric = [](const Value& v) { return v.is_number() || v.kind == Kind::boolean; };
    if (op == "**" && numeric(left) && numeric(right)) {
      const double a = left.as_double(), b = right.as_double();
      if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
      const double r = std::pow(a, b);
      if (!std::isfinite(r)) fail("Exponentiation result is not a finite real number");
      if (left.kind == Kind::floating || right.kind == Kind::floating || b < 0) return Value::of_float(r);
      return Value::of_int(static_cast<int64_t>(r));
    }
    if (left.is_number() && right.is_number()) {
      const bool is_float = left.kind == Kind::floating || right.kind == Kind::floating;
      const double a = left.as_double(), b = right.as_double();
      if (op == "+" || op == "-" || op == "*") {
        if (!is_float) {
          const int64_t x = left.integer, y = right.integer;
          return Value::of_int(op == "+" ? x + y : op == "-" ? x - y : x * y);
        }
        return Value::of_float(op == "+" ? a + b : op == "-" ? a - b : a * b);
      }
      if (op == "/") return Value::of_float(a / b);
      if (op == "//" || op == "%") {
        if (!is_float) {
          if (right.integer == 0) fail("integer division or modulo by zero");
          if (op == "%") return Value::of_int(left.integer % right.integer);
          return Value::of_int(static_cast<int64_t>(std::floor(a / b)));
        }
        return Value::of_float(op == "%" ? std::fmod(a, b) : std::floor(a / b));
      }
      if (op == "<") return Value::of(a < b);
      if (op == ">") return Value::of(a > b);
      if (op == "<=") return Value::of(a <= b);
      if (op == ">=") return Value::of(a >= b);
    } else if (left.kind == Kind::array && right.kind == Kind::array) {
      if (op == "+") {
        Array joined = *left.array;
        joined.insert(joined.end(), right.array->begin(), right.array->end());
        return Value::of(std::move(joined));
      }
    } else if (right.kind == Kind::array) {
      bool member = false;
      for (const Value& x : *right.array) member = member || strict_equal(x, left);
      if (op == "in") return Value::of(member);
      if (op == "not in") return Value::of(!member);
    }
    if ((left.kind == Kind::string || right.kind == Kind::string) && op == "+") {
      return Value::of(js_string(left) + js_string(right));
    }
    if (left.kind == Kind::string && right.kind == Kind::string) {
      if (op == "in") return Value::of(right.str.find(left.str) != std::string::npos);
      if (op == "not in") return Value::of(right.str.find(left.str) == std::string::npos);
    }
    if (left.kind == Kind::string && right.kind == Kind::object) {
      const bool has = right.object->find(left.str) != nullptr;
      if (op == "in") return Value::of(has);
      if (op == "not in") return Value::of(!has);
    }
    fail("Unknown operator \"" + op + "\" between " + type_name(left.kind) + " and " + type_name(right.kind));
  }

  static JsonOptions json_options(const Args& args) {
    JsonOptions opt;
    if (const Value* indent = args.keyword.find("indent"); indent && !indent->nullish()) {
      if (indent->kind != Kind::integer) fail("If set, indent must be a number");
      opt.indent = indent->integer;
    }
    if (const Value* v = args.keyword.find("ensure_ascii")) {
      if (v->kind != Kind::boolean) fail("If set, ensure_ascii must be a boolean");
      opt.ensure_ascii = v->boolean;
    }
    if (const Value* v = args.keyword.find("sort_keys")) {
      if (v->kind != Kind::boolean) fail("If set, sort_keys must be a boolean");
      opt.sort_keys = v->boolean;
    }
    if (const Value* v = args.keyword.find("separators"); v && !v->nullish()) {
      if (v->kind != Kind::array || v->array->size() != 2 || (*v->array)[0].kind != Kind::string ||
          (*v->array)[1].kind != Kind::string) {
        fail("separators must be a tuple of two strings");
      }
      opt.separators.emplace((*v->array)[0].str, (*v->array)[1].str);
    }
    return opt;
  }

  Value apply_filter(const Value& v, const Node& filter, Scope& scope) {
    const bool called = filter.kind == NodeKind::call;
    if (called && filter.a->kind != NodeKind::identifier) fail("Unknown filter");
    const std::string& name = called ? filter.a->text : filter.text;
    Args args = called ? eval_args(filter.list, scope) : Args{};
    const auto unknown = [&]() -> Value {
      fail("Cannot apply filter \"" + name + "\" to type: " + type_name(v.kind));
    };
    if (name == "safe") return v;
    if (name == "tojson") return Value::of(to_json(v, json_options(args), 0, true));
    if (name == "default") {
      const Value* fallback = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      if (boolean && boolean->kind != Kind::boolean) fail("`default` filter flag must be a boolean");
      if (v.kind == Kind::undefined || (boolean && boolean->boolean && !v.truthy())) return fallback ? *fallback : Value::of(std::string());
      return v;
    }
    if (name == "join") {
      const Value* sep = args.get(0, "separator");
      if (sep && sep->kind != Kind::string) fail("separator must be a string");
      std::string out;
      if (v.kind == Kind::string) {
        if (!sep) return v;
        const std::u32string cps = decode_utf8(v.str);
        for (size_t i = 0; i < cps.size(); ++i) {
          if (i) out += sep->str;
          append_utf8(out, cps[i]);
        }
        return Value::of(std::move(out));
      }
      if (v.kind != Kind::array) return unknown();
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i && sep) out += sep->str;
        out += js_string((*v.array)[i]);
      }
      return Value::of(std::move(out));
    }
    if (name == "length" || name == "count") {
      if (v.kind == Kind::array) return Value::of_int(static_cast<int64_t>(v.array->size()));
      if (v.kind == Kind::string) return Value::of_int(js_length(v.str));
      if (v.kind == Kind::object) return Value::of_int(static_cast<int64_t>(v.object->entries.size()));
      return unknown();
    }
    if (name == "string") {
      if (v.kind == Kind::array) return Value::of(to_json(v, {}, 0, false));
      if (v.kind == Kind::string) return v;
      if (v.is_number()) return Value::of(to_output(v));
      if (v.kind == Kind::boolean) return Value::of(v.boolean ? "true" : "false");
      return unknown();
    }
    if (name == "int" || name == "float") {
      const bool to_int = name == "int";
      if (v.kind == Kind::string) {
        const Value* fallback = args.get(0, "default");
        const char* p = v.str.c_str();
        char* end = nullptr;
        const double d = to_int ? static_cast<double>(std::strtoll(p, &end, 10)) : std::strtod(p, &end);
        if (end == p) return fallback ? *fallback : to_int ? Value::of_int(0) : Value::of_float(0);
        return to_int ? Value::of_int(static_cast<int64_t>(d)) : Value::of_float(d);
      }
      if (v.kind == Kind::boolean) return to_int ? Value::of_int(v.boolean) : Value::of_float(v.boolean);
      if (v.is_number()) return to_int ? Value::of_int(static_cast<int64_t>(std::floor(v.as_double()))) : Value::of_float(v.as_double());
      return unknown();
    }
    if (v.kind == Kind::array) {
      const Array& a = *v.array;
      if (name == "list") return v;
      if (name == "first") return a.empty() ? Value{} : a.front();
      if (name == "last") return a.empty() ? Value{} : a.back();
      if (name == "reverse") return Value::of(Array(a.rbegin(), a.rend()));
      if (name == "unique") {
        Array out;
        for (const Value& x : a) {
          bool seen = false;
          for (const Value& y : out) seen = seen || strict_equal(x, y);
          if (!seen) out.push_back(x);
        }
        return Value::of(std::move(out));
      }
      if (name == "sort") {
        const Value* reverse = args.get(0, "reverse");
        const Value* case_sensitive = args.get(1, "case_sensitive");
        const Value* attribute = args.get(2, "attribute");
        const bool rev = reverse && reverse->truthy();
        const bool cs = case_sensitive && case_sensitive->truthy();
        auto key = [&](const Value& item) {
          if (!attribute || attribute->nullish()) return item;
          return attribute_path(item, attribute->kind == Kind::integer ? std::to_string(attribute->integer) : attribute->str);
        };
        Array out = a;
        std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
          const int c = compare_values(key(x), key(y), cs);
          return rev ? c > 0 : c < 0;
        });
        return Value::of(std::move(out));
      }
      if (name == "map") {
        const Value* attribute = args.keyword.find("attribute");
        if (!attribute || attribute->kind != Kind::string) fail("`map` expressions without `attribute` set are not supported");
        const Value* fallback = args.keyword.find("default");
        Array out;
        for (const Value& item : a) {
          if (!item.is_mapping()) fail("items in map must be an object");
          Value x = attribute_path(item, attribute->str);
          out.push_back(x.kind == Kind::undefined && fallback ? *fallback : x);
        }
        return Value::of(std::move(out));
      }
      if (name == "selectattr" || name == "rejectattr") {
        const bool select = name == "selectattr";
        if (args.positional.empty() || args.positional[0].kind != Kind::string) fail("arguments of `" + name + "` must be strings");
        const std::string& attr = args.positional[0].str;
        Array out;
        for (const Value& item : a) {
          if (!item.is_mapping()) fail("`" + name + "` can only be applied to array of objects");
          const Value* x = item.object->find(attr);
          bool result = false;
          if (x && args.positional.size() > 1) {
            if (args.positional[1].kind != Kind::string) fail("arguments of `" + name + "` must be strings");
            result = run_test(args.positional[1].str, *x, args.positional.size() > 2 ? &args.positional[2] : nullptr);
          } else if (x) {
            result = x->truthy();
          }
          if (result == select) out.push_back(item);
        }
        return Value::of(std::move(out));
      }
      return unknown();
    }
    if (v.kind == Kind::string) {
      if (name == "upper" || name == "lower") return Value::of(ascii_case(v.str, name == "upper"));
      if (name == "title") return Value::of(title_case(v.str));
      if (name == "capitalize") return (*string_builtin(v.str, name).function)(args, scope);
      if (name == "trim") return Value::of(trim(v.str, Trim::both));
      if (name == "replace") return (*string_builtin(v.str, name).function)(args, scope);
      if (name == "indent") {
        const Value* width = args.get(0, "width");
        const Value* first = args.get(1, "first");
        const Value* blank = args.get(2, "blank");
        if (width && width->kind != Kind::integer) fail("width must be a number");
        const std::string pad(width ? width->integer : 4, ' ');
        std::string out;
        size_t start = 0, line = 0;
        while (true) {
          const size_t nl = v.str.find('\n', start);
          const std::string part = v.str.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
          const bool skip = (line == 0 && !(first && first->truthy())) || (part.empty() && !(blank && blank->truthy()));
          out += (skip ? "" : pad) + part;
          if (nl == std::string::npos) break;
          out += '\n';
          start = nl + 1;
          ++line;
        }
        return Value::of(std::move(out));
      }
      return unknown();
    }
    if (v.is_number() && name == "abs") {
      return v.kind == Kind::integer ? Value::of_int(std::abs(v.integer)) : Value::of_float(std::abs(v.number));
    }
    if (v.kind == Kind::object) {
      if (name == "items") return Value::of(object_items(*v.object));
      if (name == "dictsort") {
        Array items = object_items(*v.object);
        const Value* case_sensitive = args.get(0, "case_sensitive");
        const Value* by = args.get(1, "by");
        const Value* reverse = args.get(2, "reverse");
        const size_t index = by && by->kind == Kind::string && by->str == "value" ? 1 : 0;
        const bool cs = case_sensitive && case_sensitive->truthy();
        const bool rev = reverse && reverse->truthy();
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          const int c = compare_values((*x.array)[index], (*y.array)[index], cs);
          return rev ? c > 0 : c < 0;
        });
        return Value::of(std::move(items));
      }
      const Value method = object_builtin(v.object, name);
      if (method.kind == Kind::function) return (*method.function)(args, scope);
    }
    if (v.kind == Kind::boolean && name == "bool") return v;
    return unknown();
  }
};

/// strftime_now(format): the local time, formatted.
Value strftime_now(Args& args, Scope&) {
  if (args.positional.empty() || args.positional[0].kind != Kind::string) fail("strftime_now expects a format string");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof buf, args.positional[0].str.c_str(), &local);
  return Value::of(std::string(buf, n));
}

Value range_fn(Args& args, Scope&) {
  for (const Value& v : args.positional) {
    if (v.kind != Kind::integer) fail("range() expects integers");
  }
  int64_t start = 0, stop = 0, step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].integer;
  } else if (args.positional.size() >= 2) {
    start = args.positional[0].integer;
    stop = args.positional[1].integer;
    if (args.positional.size() > 2) step = args.positional[2].integer;
  }
  if (step == 0) fail("range() step must not be zero");
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::of_int(i));
  return Value::of(std::move(out));
}

Value namespace_fn(Args& args, Scope&) {
  if (args.positional.size() > 1) fail("namespace expected at most 1 argument");
  Object entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.kind == Kind::object) {
      entries = *source.object;
    } else if (source.kind == Kind::array) {
      for (const Value& pair : *source.array) {
        if (pair.kind != Kind::array || pair.array->size() != 2 || (*pair.array)[0].kind != Kind::string) {
          fail("namespace expected an object or an iterable of [key, value] pairs");
        }
        entries.set((*pair.array)[0].str, (*pair.array)[1]);
      }
    } else {
      fail(std::string("'") + type_name(source.kind) + "' object is not iterable");
    }
  }
  for (const auto& [k, v] : args.keyword.entries) entries.set(k, v);
  return Value::of(std::move(entries), Kind::ns);
}

Value raise_exception(Args& args, Scope&) {
  std::string message;
  for (size_t i = 0; i < args.positional.size(); ++i) message += (i ? "," : "") + js_string(args.positional[i]);
  fail(message);
}

}  // namespace

struct Template::Program {
  std::vector<NodePtr> body;
};

Template::Template(std::string_view source) : program_(std::make_unique<Program>()) {
  program_->body = Parser(tokenize(source)).parse_program();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const boost::json::object& variables) const {
  Scope global;
  global.vars.set("false", Value::of(false));
  global.vars.set("true", Value::of(true));
  global.vars.set("none", Value::none());
  global.vars.set("False", Value::of(false));
  global.vars.set("True", Value::of(true));
  global.vars.set("None", Value::none());
  global.vars.set("raise_exception", Value::of(Function(raise_exception)));
  global.vars.set("range", Value::of(Function(range_fn)));
  global.vars.set("strftime_now", Value::of(Function(strftime_now)));
  global.vars.set("namespace", Value::of(Function(namespace_fn)));
  for (const auto& kv : variables) global.vars.set(std::string(kv.key()), from_json(kv.value()));
  Interpreter interpreter;
  return interpreter.render(program_->body, global);
}

}  // namespace paged::jinja
