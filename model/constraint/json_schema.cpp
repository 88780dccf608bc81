#include "model/constraint/json_schema.h"

#include <boost/json.hpp>
#include <algorithm>
#include <cmath>
#include <optional>
#include <map>
#include <set>

#include "model/constraint/char_class.h"
#include "model/constraint/json_formats.h"
#include "model/constraint/number_ranges.h"
#include "model/constraint/regex.h"
#include "model/unicode/utf8.h"

namespace paged::constraint {

namespace json = boost::json;

namespace {

// Most integer digits a number is written with (10^16 - 1 is the largest integer generated).
constexpr int kMaxIntDigits = 16;
constexpr int64_t kMaxGeneratedInt = 9'999'999'999'999'999;
constexpr int kMaxDepth = 64;
// Most schema objects allOf merges may read in one compile (branches and references multiply), and most JSON
// values they may copy or compare (a part may be large and named many times).
constexpr int kMaxAllOfParts = 4096;
constexpr int64_t kMaxMergeWork = int64_t{1} << 22;
// Most (property, count) rules one object may need for minProperties / maxProperties.
constexpr int64_t kMaxObjectStates = int64_t{1} << 16;

Expr char_of(char c) { return bytes(ByteSet::of(static_cast<uint8_t>(c))); }

// True if every string of `e` holds only JSON whitespace.
bool only_whitespace(const Expr& e) {
  if (e.kind == Expr::Kind::bytes) {
    for (int b = 0; b < 256; ++b)
      if (e.set.contains(static_cast<uint8_t>(b)) && b != ' ' && b != '\t' && b != '\n' && b != '\r') return false;
    return true;
  }
  return std::all_of(e.items.begin(), e.items.end(), only_whitespace);
}

// The rules every JSON grammar shares: ws, value, object, array, string, number, integer.
void add_json_rules(Rules& rules, const JsonWhitespace& whitespace) {
  if (whitespace) {
    Expr ws = compile_regex(*whitespace, RegexMatch::full);
    if (!only_whitespace(ws))
      throw GrammarError("the whitespace pattern '" + *whitespace + "' admits characters other than JSON whitespace");
    rules.emplace_back("ws", std::move(ws));
  } else {
    // "" | " " | "\n" [ \t]{0,20}
    rules.emplace_back("ws", optional(alt({char_of(' '), seq({char_of('\n'), repeat(bytes([] {
                                                                                   ByteSet s = ByteSet::of(' ');
                                                                                   s.add('\t');
                                                                                   return s;
                                                                                 }()),
                                                                                 0, 20)})})));
  }
  const Expr sep = seq({ref("ws"), char_of(','), ref("ws")});
  rules.emplace_back("value", alt({ref("object"), ref("array"), ref("string"), ref("number"), literal("true"),
                                   literal("false"), literal("null")}));
  rules.emplace_back("member", seq({ref("string"), ref("ws"), char_of(':'), ref("ws"), ref("value")}));
  rules.emplace_back("object", seq({char_of('{'), ref("ws"),
                                    optional(seq({ref("member"), repeat(seq({sep, ref("member")}), 0, -1), ref("ws")})),
                                    char_of('}')}));
  rules.emplace_back("array", seq({char_of('['), ref("ws"),
                                   optional(seq({ref("value"), repeat(seq({sep, ref("value")}), 0, -1), ref("ws")})),
                                   char_of(']')}));
  // A character of a string: anything but '"', '\' and controls, or a short escape.
  ByteSet escaped;
  for (char c : std::string_view("\"\\/bfnrt")) escaped.add(static_cast<uint8_t>(c));
  rules.emplace_back("char", alt({codepoints({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true),
                                  seq({char_of('\\'), bytes(escaped)})}));
  rules.emplace_back("string", seq({char_of('"'), repeat(ref("char"), 0, -1), char_of('"')}));
  const Expr natural = alt({char_of('0'), seq({bytes(ByteSet::range('1', '9')), digits(0, kMaxIntDigits - 1)})});
  rules.emplace_back("integer", seq({optional(char_of('-')), natural}));
  ByteSet e, sign;
  e.add('e'), e.add('E'), sign.add('+'), sign.add('-');
  rules.emplace_back("number", seq({ref("integer"), optional(seq({char_of('.'), digits(1, 16)})),
                                    optional(seq({bytes(e), optional(bytes(sign)), digits(1, 3)}))}));
}

// A code point written as itself inside a JSON string (no escape): not '"', '\\' or a control character.
const CodepointRanges kPlainStringChars{{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}};

// A trie of code point strings, for key_not_in.
struct NameTrie {
  bool terminal = false;
  std::map<char32_t, NameTrie> next;
};

// The JSON string contents of plain characters (no escapes, so the text is the key) that are none of the trie's
// strings: the empty string unless a name, then at each node a character that leaves the trie (any string after
// it) or one that follows it.
Expr not_in(const NameTrie& t) {
  std::vector<Expr> parts;
  if (!t.terminal) parts.push_back(seq({}));
  CodepointRanges leave = kPlainStringChars;
  std::vector<Expr> follow;
  for (const auto& [c, child] : t.next) {
    CodepointRanges cut;
    for (const auto& [lo, hi] : leave) {
      if (c < lo || c > hi) {
        cut.emplace_back(lo, hi);
        continue;
      }
      if (lo < c) cut.emplace_back(lo, c - 1);
      if (c < hi) cut.emplace_back(c + 1, hi);
    }
    leave = std::move(cut);
    std::string bytes;
    utf8::append(bytes, c);
    follow.push_back(seq({literal(bytes), not_in(child)}));
  }
  if (!leave.empty()) parts.push_back(seq({codepoints(leave), repeat(codepoints(kPlainStringChars), 0, -1)}));
  for (Expr& f : follow) parts.push_back(std::move(f));
  return alt(std::move(parts));
}

// A JSON string (with its quotes) that is none of `names`: its characters written plainly, so that no escape
// spells a name. Names with a character that must be escaped can never be written so and need no exclusion.
Expr key_not_in(const std::set<std::string, std::less<>>& names) {
  NameTrie trie;
  for (const std::string& name : names) {
    NameTrie* at = &trie;
    bool plain = true;
    for (std::string_view rest = name; !rest.empty() && plain;) {
      const utf8::Char ch = utf8::next(rest);
      plain = ch.complete && ch.code_point >= 0x20 && ch.code_point != '"' && ch.code_point != '\\';
      if (plain) at = &at->next[ch.code_point];
      rest.remove_prefix(ch.length);
    }
    if (plain) at->terminal = true;
  }
  return seq({char_of('"'), not_in(trie), char_of('"')});
}

const std::set<std::string, std::less<>> kAnnotations{"title",    "description", "default", "examples", "$schema",
                                                      "$id",      "$comment",    "deprecated", "readOnly",
                                                      "writeOnly", "$defs",      "definitions"};

class SchemaCompiler {
 public:
  SchemaCompiler(const json::value& root, const JsonWhitespace& whitespace) : root_(root) {
    add_json_rules(rules_, whitespace);
  }

  Rules compile() {
    rules_.emplace_back("root", schema(root_, 0));
    return std::move(rules_);
  }

 private:
  [[noreturn]] static void refuse(const std::string& what) { throw GrammarError("JSON schema: " + what); }

  // A new rule holding `e`; the reference to it.
  Expr named(Expr e) {
    std::string name = "s" + std::to_string(counter_++);
    rules_.emplace_back(name, std::move(e));
    return ref(std::move(name));
  }

  Expr schema(const json::value& s, int depth) {
    if (depth > kMaxDepth) refuse("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (s.is_bool()) {
      if (!s.get_bool()) refuse("the schema false admits no value");
      return ref("value");
    }
    if (!s.is_object()) refuse("a schema must be an object or a boolean");
    const json::object& o = s.get_object();
    static const std::set<std::string, std::less<>> kKnown{
        "type",      "properties", "required",  "additionalProperties", "items",   "minItems",
        "maxItems",  "enum",       "const",     "anyOf",                "oneOf",   "minLength",
        "maxLength", "pattern",    "minimum",   "maximum",              "exclusiveMinimum", "exclusiveMaximum",
        "$ref",      "format",     "prefixItems", "allOf",         "additionalItems", "propertyNames",
        "minProperties", "maxProperties"};
    std::vector<std::string> constraining;
    for (const auto& kv : o) {
      const std::string_view key = kv.key();
      if (kAnnotations.contains(key)) continue;
      if (!kKnown.contains(key)) refuse("the keyword '" + std::string(key) + "' is not supported");
      constraining.emplace_back(key);
    }
    const auto only = [&](std::initializer_list<std::string_view> allowed, const char* what) {
      for (const std::string& k : constraining)
        if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
          refuse("'" + std::string(what) + "' together with '" + k + "' is not supported");
    };
    // allOf, and a $ref beside other constraining keywords (draft 2020-12 reads both), as one merged schema.
    if (o.contains("allOf") || (o.contains("$ref") && constraining.size() > 1))
      return schema(json::value(all_of(o, depth)), depth + 1);
    if (const json::value* r = o.if_contains("$ref")) return reference(*r, depth);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const json::value* branches = o.if_contains(key)) {
        only({key}, key);
        if (!branches->is_array() || branches->get_array().empty()) refuse(std::string("'") + key + "' must be a non-empty list");
        std::vector<Expr> alts;
        for (const json::value& b : branches->get_array()) alts.push_back(schema(b, depth + 1));
        return alt(std::move(alts));
      }
    }
    std::vector<std::string> types;
    if (const json::value* t = o.if_contains("type")) {
      if (t->is_string()) {
        types.emplace_back(t->get_string());
      } else if (t->is_array() && !t->get_array().empty()) {
        for (const json::value& x : t->get_array()) {
          if (!x.is_string()) refuse("'type' must be a string or a list of strings");
          types.emplace_back(x.get_string());
        }
      } else {
        refuse("'type' must be a string or a list of strings");
      }
      static const std::set<std::string, std::less<>> kTypes{"object", "array",   "string", "number",
                                                             "integer", "boolean", "null"};
      for (const std::string& type : types)
        if (!kTypes.contains(type)) refuse("unknown type '" + type + "'");
    }
    for (const char* key : {"enum", "const"}) {
      if (const json::value* v = o.if_contains(key)) {
        only({key, "type"}, key);
        std::vector<json::value> values;
        if (std::string_view(key) == "const") {
          values.push_back(*v);
        } else {
          if (!v->is_array() || v->get_array().empty()) refuse("'enum' must be a non-empty list");
          values.assign(v->get_array().begin(), v->get_array().end());
        }
        std::vector<Expr> alts;
        for (const json::value& x : values)
          if (types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return is_type(x, t); }))
            alts.push_back(literal(json::serialize(x)));
        if (alts.empty()) refuse(std::string("no value of '") + key + "' has the schema's type");
        return alt(std::move(alts));
      }
    }
    if (types.empty()) {
      // Without "type", the keywords say which kind of value is meant; none: any value.
      if (o.contains("properties") || o.contains("required") || o.contains("additionalProperties") ||
          o.contains("propertyNames") || o.contains("minProperties") || o.contains("maxProperties"))
        types.push_back("object");
      if (o.contains("items") || o.contains("prefixItems") || o.contains("additionalItems") || o.contains("minItems") ||
          o.contains("maxItems"))
        types.push_back("array");
      if (o.contains("minLength") || o.contains("maxLength") || o.contains("pattern") || o.contains("format"))
        types.push_back("string");
      if (o.contains("minimum") || o.contains("maximum") || o.contains("exclusiveMinimum") ||
          o.contains("exclusiveMaximum"))
        types.push_back("number");
      if (types.size() > 1) refuse("keywords of several types without 'type' are not supported");
      if (types.empty()) return ref("value");
    }
    std::vector<Expr> alts;
    for (const std::string& type : types) alts.push_back(typed(o, type, depth));
    return alt(std::move(alts));
  }

  static bool is_type(const json::value& v, std::string_view type) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "boolean") return v.is_bool();
    if (type == "null") return v.is_null();
    if (type == "integer") return v.is_int64() || v.is_uint64() || (v.is_double() && std::floor(v.get_double()) == v.get_double());
    return v.is_number();  // number
  }

  static std::optional<int64_t> count(const json::object& o, const char* key) {
    const json::value* v = o.if_contains(key);
    if (!v) return std::nullopt;
    if (!(v->is_int64() || v->is_uint64()) || (v->is_int64() && v->get_int64() < 0))
      refuse(std::string("'") + key + "' must be a non-negative integer");
    const uint64_t n = v->is_int64() ? static_cast<uint64_t>(v->get_int64()) : v->get_uint64();
    if (n > 100000) refuse(std::string("'") + key + "' above 100000 is not supported");
    return static_cast<int64_t>(n);
  }

  // A `format` binds the values of its own type only (JSON Schema, ajv-formats): a string format nothing but strings,
  // OpenAPI's int32 / int64 integers (int32: its range; int64: wider than what is written), float / double nothing.
  // int32 / int64 on a number would need integral numbers: refused, as is a format no one defines.
  static void check_format(const json::object& o, const std::string& type) {
    const json::value* f = o.if_contains("format");
    if (!f || type == "string") return;
    if (!f->is_string()) refuse("'format' must be a string");
    const std::string_view name = f->get_string();
    const bool integral = name == "int32" || name == "int64";
    if (integral && type == "number") refuse("'format' '" + std::string(name) + "' on a number is not supported");
    if (!integral && name != "float" && name != "double" && !is_string_format(name))
      refuse("the format '" + std::string(name) + "' is not supported");
  }

  Expr typed(const json::object& o, const std::string& type, int depth) {
    check_format(o, type);
    if (type == "boolean") return alt({literal("true"), literal("false")});
    if (type == "null") return literal("null");
    if (type == "number") return number(o);
    if (type == "integer") return integer(o);
    if (type == "string") return string(o);
    if (type == "array") return array(o, depth);
    return object(o, depth);
  }

  Expr integer(const json::object& o) {
    int64_t lo = -kMaxGeneratedInt, hi = kMaxGeneratedInt;
    bool bounded = false;
    const auto bound = [&](const char* key, bool lower, bool exclusive) {
      const json::value* v = o.if_contains(key);
      if (!v) return;
      if (!v->is_number()) refuse(std::string("'") + key + "' must be a number");
      // Beyond what is written (16 digits) a bound binds nothing, or leaves nothing.
      const double limit = static_cast<double>(kMaxGeneratedInt) + 1;
      const double x = std::clamp(v->to_number<double>(), -limit, limit);
      bounded = true;
      if (lower) {
        lo = std::max(lo, static_cast<int64_t>(exclusive ? std::floor(x) + 1 : std::ceil(x)));
      } else {
        hi = std::min(hi, static_cast<int64_t>(exclusive ? std::ceil(x) - 1 : std::floor(x)));
      }
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (const json::value* f = o.if_contains("format"); f && f->is_string() && f->get_string() == "int32") {
      lo = std::max<int64_t>(lo, INT32_MIN);
      hi = std::min<int64_t>(hi, INT32_MAX);
      bounded = true;
    }
    if (lo > hi) refuse("the integer bounds admit no value");
    return bounded ? integers_between(lo, hi) : ref("integer");
  }

  // Numbers within bounds are written without an exponent, at most 16 integer and 16 fraction digits. An exclusive
  // bound b becomes the inclusive bound of the next double beyond b, so that what is written reads back (as a
  // double, as JSON parsers read it) strictly beyond b.
  Expr number(const json::object& o) {
    std::optional<double> lo, hi;
    const auto bound = [&](const char* key, bool lower, bool exclusive) {
      const json::value* v = o.if_contains(key);
      if (!v) return;
      if (!v->is_number()) refuse(std::string("'") + key + "' must be a number");
      double x = v->to_number<double>();
      if (!std::isfinite(x)) refuse(std::string("'") + key + "' must be finite");
      if (exclusive) x = std::nextafter(x, lower ? HUGE_VAL : -HUGE_VAL);
      std::optional<double>& b = lower ? lo : hi;
      b = !b ? x : lower ? std::max(*b, x) : std::min(*b, x);
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (!lo && !hi) return ref("number");
    return decimals_between(lo.value_or(-HUGE_VAL), hi.value_or(HUGE_VAL));
  }

  Expr string(const json::object& o) {
    const std::optional<int64_t> min = count(o, "minLength"), max = count(o, "maxLength");
    if (const json::value* p = o.if_contains("pattern")) {
      if (min || max || o.contains("format"))
        refuse("'pattern' together with 'minLength', 'maxLength' or 'format' is not supported");
      if (!p->is_string()) refuse("'pattern' must be a string");
      return seq({char_of('"'), compile_regex(p->get_string(), RegexMatch::search, RegexOutput::json_string),
                  char_of('"')});
    }
    if (min && max && *max < *min) refuse("'maxLength' is below 'minLength'");
    if (const json::value* f = o.if_contains("format")) {
      if (!f->is_string()) refuse("'format' must be a string");
      if (auto format = string_format(f->get_string(), max ? std::optional<int>(static_cast<int>(*max)) : std::nullopt)) {
        // Lengths are supported where the format's own bounds imply them (the format shrinks to fit a maxLength).
        const LengthRange& lengths = format->second;
        if ((min && lengths.min < *min) || (max && (!lengths.max || *lengths.max > *max)))
          refuse("'format' '" + std::string(f->get_string()) + "' with values of " + std::to_string(lengths.min) +
                 (lengths.max ? "-" + std::to_string(*lengths.max) : "+") +
                 " characters together with 'minLength' / 'maxLength' outside them is not supported");
        return seq({char_of('"'), std::move(format->first), char_of('"')});
      }
    }
    if (!min && !max) return ref("string");
    return seq({char_of('"'), repeat(ref("char"), static_cast<int>(min.value_or(0)), max ? static_cast<int>(*max) : -1),
                char_of('"')});
  }

  Expr array(const json::object& o, int depth) {
    const json::value* items = o.if_contains("items");
    const int64_t min = count(o, "minItems").value_or(0);
    const std::optional<int64_t> max = count(o, "maxItems");
    if (max && *max < min) refuse("'maxItems' is below 'minItems'");
    if (const json::value* prefix = o.if_contains("prefixItems")) {
      if (items && items->is_array()) refuse("'items' as a list beside 'prefixItems' is not supported");
      if (o.contains("additionalItems")) refuse("'additionalItems' beside 'prefixItems' is not supported (use 'items')");
      return tuple(*prefix, items, min, max, depth);
    }
    if (items && items->is_array()) return tuple(*items, o.if_contains("additionalItems"), min, max, depth);  // draft 4-7
    if (o.contains("additionalItems")) refuse("'additionalItems' needs 'items' as a list");
    const Expr sep = seq({ref("ws"), char_of(','), ref("ws")});
    const Expr item = items ? named(schema(*items, depth + 1)) : ref("value");
    if (max && *max == 0) return seq({char_of('['), ref("ws"), char_of(']')});
    Expr rest = repeat(seq({sep, item}), static_cast<int>(std::max<int64_t>(min - 1, 0)),
                       max ? static_cast<int>(*max - 1) : -1);
    Expr some = seq({item, std::move(rest), ref("ws")});
    return seq({char_of('['), ref("ws"), min > 0 ? std::move(some) : optional(std::move(some)), char_of(']')});
  }

  // prefixItems (draft 2020-12; draft 4-7: items as a list): element i of the array follows schema i of the list;
  // elements after the list follow `items` (draft 4-7: additionalItems; absent or false: none, as
  // additionalProperties' default; true: any value).
  Expr tuple(const json::value& prefix, const json::value* items, int64_t min, std::optional<int64_t> max, int depth) {
    if (!prefix.is_array() || prefix.get_array().empty()) refuse("'prefixItems' (or 'items' as a list) must be a non-empty list");
    const json::array& schemas = prefix.get_array();
    const int64_t fixed = static_cast<int64_t>(schemas.size());
    const bool open = items && !(items->is_bool() && !items->get_bool());
    if (!open && min > fixed) refuse("'minItems' is above the number of 'prefixItems' and 'items' allows no more");
    const int64_t most = max.value_or(open ? -1 : fixed);
    const Expr sep = seq({ref("ws"), char_of(','), ref("ws")});
    // tail: the elements from index i on, each after a comma; built from the end.
    Expr tail = seq({});
    if (open && (most < 0 || most > fixed)) {
      const Expr item = named(schema(*items, depth + 1));
      tail = repeat(seq({sep, item}), static_cast<int>(std::max<int64_t>(min - fixed, 0)),
                    most < 0 ? -1 : static_cast<int>(most - fixed));
    }
    for (int64_t i = std::min<int64_t>(fixed, most < 0 ? fixed : most); i-- > 1;) {
      Expr piece = seq({sep, named(schema(schemas[static_cast<size_t>(i)], depth + 1)), std::move(tail)});
      tail = named(i >= min ? optional(std::move(piece)) : std::move(piece));
    }
    if (most == 0) return seq({char_of('['), ref("ws"), char_of(']')});
    Expr some = seq({named(schema(schemas[0], depth + 1)), std::move(tail), ref("ws")});
    return seq({char_of('['), ref("ws"), min > 0 ? std::move(some) : optional(std::move(some)), char_of(']')});
  }

  // An object: the members of `properties` in their order (required ones always, the others or not), then the
  // additional members (additionalProperties; their keys per propertyNames), the count of members within
  // minProperties / maxProperties. Rule (i, c): the members from property i on, c members written so far (counted
  // up to what the bounds need; c > 0: a comma comes first); states that cannot reach minProperties are left out.
  Expr object(const json::object& o, int depth) {
    // propertyNames: a list of names (enum / const), or a string schema when no property is declared.
    std::optional<std::set<std::string, std::less<>>> key_set;
    std::optional<Expr> key_schema;
    if (const json::value* pn = o.if_contains("propertyNames")) {
      if (!pn->is_object()) refuse("'propertyNames' must be an object");
      const json::object& k = pn->get_object();
      if (k.contains("enum") || k.contains("const")) {
        key_set.emplace();
        const auto add = [&](const json::value& v) {
          if (v.is_string()) key_set->emplace(v.get_string());
        };
        if (const json::value* c = k.if_contains("const")) add(*c);
        if (const json::value* e = k.if_contains("enum"); e && e->is_array())
          for (const json::value& v : e->get_array()) add(v);
      } else {
        if (o.contains("properties"))
          refuse("'propertyNames' other than enum or const beside 'properties' is not supported");
        // Keys are strings: a propertyNames whose type admits none leaves no additional member.
        bool strings = true;
        if (const json::value* t = k.if_contains("type")) {
          const auto is_string = [](const json::value& x) { return x.is_string() && x.get_string() == "string"; };
          strings = is_string(*t) || (t->is_array() && std::any_of(t->get_array().begin(), t->get_array().end(), is_string));
        }
        if (strings) {
          json::object as_string = k;
          as_string["type"] = "string";
          key_schema = named(schema(json::value(std::move(as_string)), depth + 1));
        } else {
          key_set.emplace();  // no name at all
        }
      }
    }
    std::vector<std::pair<std::string, Expr>> props;  // (name, value)
    std::set<std::string, std::less<>> names;
    std::set<std::string, std::less<>> required;
    if (const json::value* r = o.if_contains("required")) {
      if (!r->is_array()) refuse("'required' must be a list of names");
      for (const json::value& n : r->get_array()) {
        if (!n.is_string()) refuse("'required' must be a list of names");
        required.emplace(n.get_string());
      }
    }
    if (const json::value* p = o.if_contains("properties")) {
      if (!p->is_object()) refuse("'properties' must be an object");
      for (const auto& kv : p->get_object()) {
        if (key_set && !key_set->contains(kv.key())) {
          if (required.contains(kv.key()))
            refuse("required property '" + std::string(kv.key()) + "' is not one of 'propertyNames'");
          continue;  // a name propertyNames refuses is never written
        }
        names.emplace(kv.key());
        props.emplace_back(std::string(kv.key()), schema(kv.value(), depth + 1));
      }
    }
    for (const std::string& r : required)
      if (!names.contains(r)) refuse("required property '" + r + "' is not in 'properties'");
    const std::optional<int64_t> min_count = count(o, "minProperties"), max_count = count(o, "maxProperties");
    if (min_count && max_count && *max_count < *min_count) refuse("'maxProperties' is below 'minProperties'");
    const int64_t least = min_count.value_or(0);
    const auto member = [](Expr key, Expr value) {
      return seq({std::move(key), ref("ws"), char_of(':'), ref("ws"), std::move(value)});
    };
    std::optional<Expr> extra;  // an additional member; none: not allowed
    if (const json::value* a = o.if_contains("additionalProperties"); a && !(a->is_bool() && !a->get_bool())) {
      // Keys of `properties` are theirs: an additional member takes any other key (a name written again would be
      // validated by additionalProperties instead of its own schema).
      std::optional<Expr> key;
      if (key_schema) {
        key = *key_schema;
      } else if (key_set) {
        std::vector<Expr> others;
        for (const std::string& k : *key_set)
          if (!names.contains(k)) others.push_back(literal(json::serialize(json::value(k))));
        if (!others.empty()) key = named(alt(std::move(others)));
      } else {
        key = names.empty() ? ref("string") : named(key_not_in(names));
      }
      if (key) extra = named(member(std::move(*key), schema(*a, depth + 1)));
    }
    const Expr sep = seq({ref("ws"), char_of(','), ref("ws")});
    const int64_t n = static_cast<int64_t>(props.size());
    // Counts above `cap` need not be told apart: the bounds' largest, at least 1 (first member or not).
    const int64_t cap = std::max<int64_t>({1, least, max_count.value_or(0)});
    if ((n + 1) * (cap + 1) > kMaxObjectStates)
      refuse("'minProperties' / 'maxProperties' with these properties need more than " +
             std::to_string(kMaxObjectStates) + " states");
    const auto next_count = [&](int64_t c) -> std::optional<int64_t> {
      if (max_count) return c + 1 <= *max_count ? std::optional<int64_t>(c + 1) : std::nullopt;
      return std::min(c + 1, cap);
    };
    // rules[c]: rule (i, c) of the i being built (nullopt: it cannot complete), from i = n down.
    std::vector<std::optional<Expr>> rules(static_cast<size_t>(cap + 1));
    for (int64_t c = 0; c <= cap; ++c) {
      const int64_t lo = std::max<int64_t>(least - c, 0);
      const int64_t hi = max_count ? *max_count - c : -1;
      if (hi == 0 || !extra) {
        if (lo == 0) rules[c] = named(seq({}));
        continue;
      }
      const int more_lo = static_cast<int>(std::max<int64_t>(lo - 1, 0)), more_hi = hi < 0 ? -1 : static_cast<int>(hi - 1);
      Expr e = c > 0 ? repeat(seq({sep, *extra}), static_cast<int>(lo), hi < 0 ? -1 : static_cast<int>(hi))
                     : seq({*extra, repeat(seq({sep, *extra}), more_lo, more_hi)});
      rules[c] = named(c == 0 && lo == 0 ? optional(std::move(e)) : std::move(e));
    }
    for (int64_t i = n; i-- > 0;) {
      const Expr m = named(member(literal(json::serialize(json::value(props[i].first))), std::move(props[i].second)));
      const bool must = required.contains(props[i].first);
      std::vector<std::optional<Expr>> here(rules.size());
      for (int64_t c = 0; c <= cap; ++c) {
        std::vector<Expr> alts;
        if (const std::optional<int64_t> c2 = next_count(c); c2 && rules[*c2])
          alts.push_back(c > 0 ? seq({sep, m, *rules[*c2]}) : seq({m, *rules[*c2]}));
        if (!must && rules[c]) alts.push_back(*rules[c]);
        if (!alts.empty()) here[c] = named(alt(std::move(alts)));
      }
      rules = std::move(here);
    }
    if (!rules[0]) refuse("the object's 'properties', 'required' and 'minProperties' / 'maxProperties' admit no value");
    return seq({char_of('{'), ref("ws"), *rules[0], ref("ws"), char_of('}')});
  }

  // allOf as one schema: the keywords of the object and of each branch (a branch's $ref and nested allOf read
  // through), merged where JSON Schema's meaning allows it: properties joined (a name in several: allOf of its
  // schemas), required joined, types intersected, the tighter of two bounds, equal values once. A branch's explicit
  // additionalProperties reads only that branch's properties: it must name every property of the merged schema.
  // Any other keyword in two places with two values is refused.
  json::object all_of(const json::object& o, int depth) {
    std::vector<const json::object*> parts;
    collect_all_of(o, parts, depth);
    json::object merged;
    for (const json::object* part : parts) {
      for (const auto& kv : *part) {
        const std::string_view key = kv.key();
        if (key == "allOf" || key == "$ref" || kAnnotations.contains(key)) continue;
        json::value* have = merged.if_contains(key);
        charge(kv.value());
        if (!have) {
          merged[key] = kv.value();
        } else if (key == "properties" && have->is_object() && kv.value().is_object()) {
          for (const auto& p : kv.value().get_object()) {
            json::value* same = have->get_object().if_contains(p.key());
            if (!same) {
              have->get_object()[p.key()] = p.value();
            } else if (same->is_object() && same->get_object().size() == 1 && same->get_object().contains("allOf") &&
                       same->get_object().at("allOf").is_array()) {
              same->get_object().at("allOf").get_array().push_back(p.value());  // allOf of allOf: one list
            } else {
              charge(*same);
              *same = json::object{{"allOf", json::array{*same, p.value()}}};
            }
          }
        } else if (key == "required" && have->is_array() && kv.value().is_array()) {
          for (const json::value& name : kv.value().get_array()) {
            charge_units(static_cast<int64_t>(have->get_array().size()));
            if (std::find(have->get_array().begin(), have->get_array().end(), name) == have->get_array().end())
              have->get_array().push_back(name);
          }
        } else if (key == "type") {
          *have = intersect_types(*have, kv.value());
        } else if (*have != kv.value()) {
          if (!have->is_number() || !kv.value().is_number()) refuse("allOf: '" + std::string(key) + "' in two branches with two values is not supported");
          const bool lower = key == "minimum" || key == "exclusiveMinimum" || key == "minLength" || key == "minItems";
          const bool upper = key == "maximum" || key == "exclusiveMaximum" || key == "maxLength" || key == "maxItems";
          if (!lower && !upper) refuse("allOf: '" + std::string(key) + "' in two branches with two values is not supported");
          const double a = have->to_number<double>(), b = kv.value().to_number<double>();
          if (lower ? b > a : b < a) *have = kv.value();
        }
      }
    }
    if (const json::value* names = merged.if_contains("properties"); names && names->is_object()) {
      for (const json::object* part : parts) {
        if (!part->contains("additionalProperties")) continue;
        const json::value* own = part->if_contains("properties");
        for (const auto& p : names->get_object())
          if (!own || !own->is_object() || !own->get_object().contains(p.key()))
            refuse("allOf: the property '" + std::string(p.key()) +
                   "' is not in the 'properties' beside an 'additionalProperties' (JSON Schema would refuse it there)");
      }
    }
    return merged;
  }

  // Counts `v`'s values (each member and element once) against kMaxMergeWork, refusing past it.
  void charge(const json::value& v) {
    std::vector<const json::value*> stack{&v};
    while (!stack.empty()) {
      const json::value* x = stack.back();
      stack.pop_back();
      charge_units(1);
      if (x->is_object())
        for (const auto& m : x->get_object()) stack.push_back(&m.value());
      else if (x->is_array())
        for (const json::value& e : x->get_array()) stack.push_back(&e);
    }
  }
  void charge_units(int64_t n) {
    merge_work_ += n;
    if (merge_work_ > kMaxMergeWork)
      refuse("allOf: more than " + std::to_string(kMaxMergeWork) + " values to copy or compare in merging");
  }

  // The objects allOf joins: `o` itself, then each branch (references followed, nested allOf flattened).
  void collect_all_of(const json::object& o, std::vector<const json::object*>& parts, int depth) {
    if (depth > kMaxDepth) refuse("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (++all_of_parts_ > kMaxAllOfParts)
      refuse("allOf: more than " + std::to_string(kMaxAllOfParts) + " schemas to merge");
    parts.push_back(&o);
    if (const json::value* r = o.if_contains("$ref")) collect_all_of(resolve(*r), parts, depth + 1);
    const json::value* branches = o.if_contains("allOf");
    if (!branches) return;
    if (!branches->is_array() || branches->get_array().empty()) refuse("'allOf' must be a non-empty list");
    for (const json::value& b : branches->get_array()) {
      if (b.is_bool() && b.get_bool()) continue;
      if (!b.is_object()) refuse("an 'allOf' branch must be an object or true");
      collect_all_of(b.get_object(), parts, depth + 1);
    }
  }

  static json::value intersect_types(const json::value& a, const json::value& b) {
    const auto list = [](const json::value& t) {
      std::vector<std::string> out;
      if (t.is_string()) out.emplace_back(t.get_string());
      if (t.is_array())
        for (const json::value& x : t.get_array())
          if (x.is_string()) out.emplace_back(x.get_string());
      if (out.empty()) refuse("'type' must be a string or a list of strings");
      return out;
    };
    json::array both;
    const std::vector<std::string> lb = list(b);
    const auto has = [&](std::string_view t) { return std::find(lb.begin(), lb.end(), t) != lb.end(); };
    for (const std::string& t : list(a)) {
      if (has(t)) both.emplace_back(t);
      else if ((t == "integer" && has("number")) || (t == "number" && has("integer"))) both.emplace_back("integer");
    }
    if (both.empty()) refuse("allOf: the branches' types admit no value");
    return both;
  }

  // What a "#..." pointer names.
  const json::value& target_of(const json::value& r) const {
    if (!r.is_string()) refuse("'$ref' must be a string");
    const std::string_view target = r.get_string();
    if (target.empty() || target[0] != '#')
      refuse("'$ref' to '" + std::string(target) + "': only references within the schema (\"#...\") are supported");
    try {
      return target.size() > 1 ? root_.at_pointer(target.substr(1)) : root_;
    } catch (const std::exception&) {
      refuse("'$ref' to '" + std::string(target) + "' points to nothing");
    }
  }

  const json::object& resolve(const json::value& r) const {
    const json::value& at = target_of(r);
    if (!at.is_object()) refuse("'$ref' to '" + std::string(r.get_string()) + "' beside other keywords must name an object");
    return at.get_object();
  }

  // A chain of references nests as deeply as the schemas it names: `depth` goes on.
  Expr reference(const json::value& r, int depth) {
    const json::value& at = target_of(r);
    const std::string target(r.get_string());
    if (auto it = refs_.find(target); it != refs_.end()) return ref(it->second);
    const std::string name = "ref" + std::to_string(counter_++);
    refs_.emplace(target, name);
    Expr body = schema(at, depth + 1);
    rules_.emplace_back(name, std::move(body));
    return ref(name);
  }

  const json::value& root_;
  Rules rules_;
  std::map<std::string, std::string> refs_;  // pointer -> rule name
  int counter_ = 0;
  int all_of_parts_ = 0;                      // schema objects read by allOf merges so far
  int64_t merge_work_ = 0;                    // JSON values they copied or compared so far
};

}  // namespace

Rules json_schema_rules(const json::value& schema, const JsonWhitespace& whitespace) {
  return SchemaCompiler(schema, whitespace).compile();
}

Grammar compile_json_schema(const json::value& schema, const JsonWhitespace& whitespace) {
  return build_grammar(json_schema_rules(schema, whitespace), "root");
}

Grammar compile_json_object(const JsonWhitespace& whitespace) {
  Rules rules;
  add_json_rules(rules, whitespace);
  rules.emplace_back("root", ref("object"));
  return build_grammar(rules, "root");
}

}  // namespace paged::constraint
