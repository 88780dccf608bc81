// The interpreter's values: JavaScript-like (the renderer's) reference-counted arrays, insertion-ordered dicts,
// namespaces and functions, with the renderer's conversions to strings and JSON and its equality.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/fwd.hpp>

namespace paged::jinja {

enum class Kind { undefined, none, boolean, integer, floating, string, array, object, ns, function };

struct Value;
struct Object;
struct Args;
struct Scope;  // interpreter.h: the variables a function is called from
using Array = std::vector<Value>;
using Function = std::function<Value(Args&, Scope&)>;

/// A value; which payload field holds it depends on `kind` (a default-constructed Value is undefined).
struct Value {
  Kind kind = Kind::undefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  std::string str;
  std::shared_ptr<Array> array;       // arrays and tuples; shared: identity as in JavaScript
  std::shared_ptr<Object> object;     // dicts and namespaces
  std::shared_ptr<Function> function;
  int depth = 0;                      // arrays and mappings: how deep the arrays and mappings they hold nest, plus 1

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
  /// A new string, charged to the open render (model/template/jinja/budget.h).
  static Value of(std::string s);
  static Value of(const char* s) { return of(std::string(s)); }
  /// A new array, charged to the open render; throws TemplateError when it would nest deeper than
  /// max_value_depth().
  static Value of(Array a);
  static Value of(Function f) {
    Value v = make(Kind::function);
    v.function = std::make_shared<Function>(std::move(f));
    return v;
  }
  /// A dict, or a namespace when `kind` is Kind::ns; charged and bounded as arrays are (a namespace is emptied when
  /// the render closes).
  static Value of(Object o, Kind kind = Kind::object);

  bool is_number() const { return kind == Kind::integer || kind == Kind::floating; }
  bool is_mapping() const { return kind == Kind::object || kind == Kind::ns; }
  bool nullish() const { return kind == Kind::none || kind == Kind::undefined; }
  /// The number of an integer, float or boolean (true is 1).
  double as_double() const {
    return kind == Kind::integer ? static_cast<double>(integer) : kind == Kind::boolean ? (boolean ? 1.0 : 0.0) : number;
  }
  /// Jinja truthiness: false for undefined, none, false, 0, NaN and empty strings, arrays and dicts.
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
  /// The value under `key`, or nullptr.
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : entries) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  /// Replaces the value under `key` in place, or appends the entry.
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

/// The arguments of a call.
struct Args {
  std::vector<Value> positional;
  Object keyword;
  /// Positional argument i, else keyword `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const {
    if (i < positional.size()) return &positional[i];
    return keyword.find(name);
  }
};

/// The renderer's name of a kind ("StringValue", ...), as its error messages say it.
const char* type_name(Kind k);

/// The JavaScript String(value) of a value's payload (what `~`, `+` and join use).
std::string js_string(const Value& v);

/// How `{{ value }}` prints it.
std::string to_output(const Value& v);

/// The keyword arguments of `tojson`.
struct JsonOptions {
  std::optional<int64_t> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key) separators
};

/// The `tojson` serialisation (JSON.stringify-like, Python's default separators) at nesting `depth`; undefined
/// prints as null when `undefined_to_null`, else as undefined. Throws TemplateError for a function.
std::string to_json(const Value& v, const JsonOptions& opt, int depth, bool undefined_to_null);

/// JavaScript `==` on the values' payloads (what the renderer's == and != do).
bool loose_equal(const Value& a, const Value& b);

/// JavaScript `===` on payloads (membership in a list).
bool strict_equal(const Value& a, const Value& b);

/// A JSON value as the renderer sees it after JSON.parse (integral numbers become integers).
Value from_json(const boost::json::value& j);

}  // namespace paged::jinja
