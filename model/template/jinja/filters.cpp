#include "model/template/jinja/filters.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/error.h"
#include "model/template/jinja/methods.h"
#include "model/template/jinja/text.h"

namespace paged::jinja {
namespace {

[[noreturn]] void unknown_filter(const std::string& name, const Value& v) {
  fail("Cannot apply filter \"" + name + "\" to type: " + type_name(v.kind));
}

/// -1, 0 or 1 as `a` sorts before, with or after `b`: numbers and booleans by value, strings by bytes (ASCII case
/// folded unless `case_sensitive`), undefined and none equal to themselves; throws for other kinds or a mix.
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

/// The `tojson` keyword arguments (indent, ensure_ascii, sort_keys, separators), checked.
JsonOptions json_options(const Args& args) {
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

/// The filters of arrays (list, first, last, reverse, unique, sort, map, selectattr, rejectattr).
Value array_filter(const std::string& name, const Value& v, Args& args) {
  const Array& a = *v.array;
  if (name == "list") return v;
  if (name == "first") return a.empty() ? Value{} : a.front();
  if (name == "last") return a.empty() ? Value{} : a.back();
  if (name == "reverse") return Value::of(Array(a.rbegin(), a.rend()));
  if (name == "unique") {
    Array out;
    for (const Value& x : a) {
      charge_steps(static_cast<int64_t>(out.size()) + 1);
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
  unknown_filter(name, v);
}

/// The filters of strings (upper, lower, title, capitalize, trim, replace, indent).
Value string_filter(const std::string& name, const Value& v, Args& args, Scope& scope) {
  if (name == "upper" || name == "lower") return Value::of(ascii_case(v.str, name == "upper"));
  if (name == "title") return Value::of(title_case(v.str));
  if (name == "capitalize") return (*string_method(v.str, name).function)(args, scope);
  if (name == "trim") return Value::of(trim(v.str, Trim::both));
  if (name == "replace") return (*string_method(v.str, name).function)(args, scope);
  if (name == "indent") {
    const Value* width = args.get(0, "width");
    const Value* first = args.get(1, "first");
    const Value* blank = args.get(2, "blank");
    if (width && width->kind != Kind::integer) fail("width must be a number");
    const int64_t pad_width = width ? std::clamp<int64_t>(width->integer, 0, int64_t{1} << 40) : 4;
    charge_bytes(static_cast<size_t>(pad_width));
    const std::string pad(static_cast<size_t>(pad_width), ' ');
    std::string out;
    size_t start = 0, line = 0;
    while (true) {
      const size_t nl = v.str.find('\n', start);
      const std::string part = v.str.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool skip = (line == 0 && !(first && first->truthy())) || (part.empty() && !(blank && blank->truthy()));
      charge_bytes((skip ? 0 : pad.size()) + part.size());
      out += (skip ? "" : pad) + part;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      ++line;
    }
    return Value::of(std::move(out));
  }
  unknown_filter(name, v);
}

/// The filters of dicts (items, dictsort, and the dict methods get, keys, values).
Value dict_filter(const std::string& name, const Value& v, Args& args, Scope& scope) {
  if (name == "items") return Value::of(dict_items(*v.object));
  if (name == "dictsort") {
    Array items = dict_items(*v.object);
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
  const Value method = dict_method(v.object, name);
  if (method.kind == Kind::function) return (*method.function)(args, scope);
  unknown_filter(name, v);
}

}  // namespace

bool run_test(const std::string& name, const Value& v, const Value* arg) {
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

Value apply_filter(const std::string& name, const Value& v, Args& args, Scope& scope) {
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
      const std::u32string cps = code_points(v.str);
      charge_bytes(cps.size() * (sep->str.size() + 4));
      for (size_t i = 0; i < cps.size(); ++i) {
        if (i) out += sep->str;
        append_code_point(out, cps[i]);
      }
      return Value::of(std::move(out));
    }
    if (v.kind != Kind::array) unknown_filter(name, v);
    for (size_t i = 0; i < v.array->size(); ++i) {
      const std::string item = js_string((*v.array)[i]);
      charge_bytes(item.size() + (sep ? sep->str.size() : 0));
      if (i && sep) out += sep->str;
      out += item;
    }
    return Value::of(std::move(out));
  }
  if (name == "length" || name == "count") {
    if (v.kind == Kind::array) return Value::of_int(static_cast<int64_t>(v.array->size()));
    if (v.kind == Kind::string) return Value::of_int(js_length(v.str));
    if (v.kind == Kind::object) return Value::of_int(static_cast<int64_t>(v.object->entries.size()));
    unknown_filter(name, v);
  }
  if (name == "string") {
    if (v.kind == Kind::array) return Value::of(to_json(v, {}, 0, false));
    if (v.kind == Kind::string) return v;
    if (v.is_number()) return Value::of(to_output(v));
    if (v.kind == Kind::boolean) return Value::of(v.boolean ? "true" : "false");
    unknown_filter(name, v);
  }
  if (name == "int" || name == "float") {
    const bool to_int = name == "int";
    if (v.kind == Kind::string) {
      const Value* fallback = args.get(0, "default");
      const char* p = v.str.c_str();
      char* end = nullptr;
      const double d = to_int ? static_cast<double>(std::strtoll(p, &end, 10)) : std::strtod(p, &end);
      if (end == p) return fallback ? *fallback : to_int ? Value::of_int(0) : Value::of_float(0);
      return to_int ? Value::of_int(int_of(d)) : Value::of_float(d);
    }
    if (v.kind == Kind::boolean) return to_int ? Value::of_int(v.boolean) : Value::of_float(v.boolean);
    if (v.is_number())
      return to_int ? Value::of_int(v.kind == Kind::integer ? v.integer : int_of(std::floor(v.number)))
                    : Value::of_float(v.as_double());
    unknown_filter(name, v);
  }
  if (v.kind == Kind::array) return array_filter(name, v, args);
  if (v.kind == Kind::string) return string_filter(name, v, args, scope);
  if (v.is_number() && name == "abs") {
    return v.kind == Kind::integer ? Value::of_int(int_arith('*', v.integer < 0 ? -1 : 1, v.integer))
                                   : Value::of_float(std::abs(v.number));
  }
  if (v.kind == Kind::object) return dict_filter(name, v, args, scope);
  if (v.kind == Kind::boolean && name == "bool") return v;
  unknown_filter(name, v);
}

}  // namespace paged::jinja
