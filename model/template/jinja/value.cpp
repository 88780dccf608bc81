#include "model/template/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include <boost/json.hpp>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/error.h"
#include "model/template/jinja/text.h"

namespace paged::jinja {
namespace {

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (char32_t c : code_points(s)) {
    char buf[16];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (const char letter = escape_of_control(c)) {
      out += '\\';
      out += letter;
    } else if (c < 0x20) {
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
      append_code_point(out, c);
    }
  }
  return out + "\"";
}

bool is_primitive(const Value& v) {
  return v.kind == Kind::boolean || v.is_number() || v.kind == Kind::string;
}

// The depth of a container holding `v`; fails past max_value_depth().
int depth_around(const Value& v, int inner) {
  const int depth = std::max(inner, v.depth + 1);
  if (depth > max_value_depth())
    fail("lists and dicts nest deeper than " + std::to_string(max_value_depth()) + " levels");
  return depth;
}

}  // namespace

Value Value::of(std::string s) {
  charge_bytes(s.size());
  Value v = make(Kind::string);
  v.str = std::move(s);
  return v;
}

Value Value::of(Array a) {
  Value v = make(Kind::array);
  v.depth = 1;
  size_t bytes = a.size() * sizeof(Value);
  for (const Value& x : a) {
    v.depth = depth_around(x, v.depth);
    bytes += x.str.size();
  }
  charge_steps(static_cast<int64_t>(a.size()));
  charge_bytes(bytes);
  v.array = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::of(Object o, Kind kind) {
  Value v = make(kind);
  v.depth = 1;
  size_t bytes = o.entries.size() * sizeof(o.entries[0]);
  for (const auto& [key, x] : o.entries) {
    v.depth = depth_around(x, v.depth);
    bytes += key.size() + x.str.size();
  }
  charge_steps(static_cast<int64_t>(o.entries.size()));
  charge_bytes(bytes);
  v.object = std::make_shared<Object>(std::move(o));
  if (kind == Kind::ns)
    if (RenderBudget* budget = RenderBudget::current()) budget->keep(v.object);
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
  // Namespaces may hold each other: the depth bounds the walk.
  if (depth >= max_value_depth()) fail("tojson: lists and dicts nest deeper than " + std::to_string(depth) + " levels");
  const bool indented = opt.indent && *opt.indent > 0;
  std::string item_sep = indented ? "," : ", ", key_sep = ": ";
  if (opt.separators) std::tie(item_sep, key_sep) = *opt.separators;
  if (indented)  // unit, base and child below, before they are made (an indent of 2^40 fails here)
    charge_bytes(static_cast<size_t>(std::min<int64_t>(*opt.indent, int64_t{1} << 40)) * (depth + 2));
  const std::string unit = indented ? std::string(*opt.indent, ' ') : "";
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += unit;
  const std::string child = base + unit;
  std::vector<std::string> core;
  if (v.kind == Kind::array) {
    for (const Value& x : *v.array) {
      core.push_back(to_json(x, opt, depth + 1, undefined_to_null));
      charge_bytes(core.back().size() + (indented ? child.size() : 0) + item_sep.size());
    }
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
    charge_bytes(core.back().size() + item_sep.size());
  }
  std::string out = "{";
  for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
  return out + (indented && !core.empty() ? base : "") + "}";
}

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

}  // namespace paged::jinja
