#include "model/template/jinja/methods.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/error.h"
#include "model/template/jinja/text.h"

namespace paged::jinja {
namespace {

/// Python's str.strip/lstrip/rstrip: `chars` (a string) or whitespace when absent or none.
Value strip_method(const std::string& s, Args& args, Trim where) {
  const Value* chars = args.get(0, "chars");
  if (!chars || chars->nullish()) return Value::of(trim(s, where));
  if (chars->kind != Kind::string) fail("strip arg must be None or str");
  const std::u32string set = code_points(chars->str);
  return Value::of(trim(s, where, &set));
}

/// Python's str.split(sep, maxsplit): on runs of whitespace when `sep` is absent or none.
Value split_method(const std::string& s, Args& args) {
  const Value* sep = args.get(0, "sep");
  const Value* maxsplit_v = args.get(1, "maxsplit");
  const int64_t maxsplit = maxsplit_v ? maxsplit_v->integer : -1;
  if (maxsplit_v && maxsplit_v->kind != Kind::integer) fail("maxsplit argument must be a number");
  Array parts;
  if (!sep || sep->nullish()) {
    const std::u32string text = code_points(trim(s, Trim::start));
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i;
      while (j < text.size() && !is_js_space(text[j])) ++j;
      if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(Value::of(from_code_points(std::u32string_view(text).substr(i))));
        break;
      }
      parts.push_back(Value::of(from_code_points(std::u32string_view(text).substr(i, j - i))));
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

/// `s` with its first `count` occurrences of `old` (all when count < 0) replaced by `with`; an empty `old` matches
/// before every code point and at the end.
std::string replace_all(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  if (count == 0) return s;
  int64_t remaining = count < 0 ? std::numeric_limits<int64_t>::max() : count;
  std::string out;
  if (old.empty()) {
    const std::u32string cps = code_points(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (remaining > 0) {
        charge_bytes(with.size());
        out += with;
        --remaining;
      }
      if (i < cps.size()) append_code_point(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  while (remaining > 0) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    charge_bytes(at - start + with.size());
    out.append(s, start, at - start);
    out += with;
    start = at + old.size();
    --remaining;
  }
  return out + s.substr(start);
}

}  // namespace

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

Value string_method(const std::string& s, std::string_view name) {
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

Array dict_items(const Object& o) {
  Array items;
  for (const auto& [k, v] : o.entries) items.push_back(Value::of(Array{Value::of(k), v}));
  return items;
}

Value dict_method(const std::shared_ptr<Object>& o, std::string_view name) {
  if (name == "get") {
    return Value::of(Function([o](Args& a, Scope&) {
      if (a.positional.empty() || a.positional[0].kind != Kind::string) fail("Object key must be a string");
      if (const Value* v = o->find(a.positional[0].str)) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    }));
  }
  if (name == "items") return Value::of(Function([o](Args&, Scope&) { return Value::of(dict_items(*o)); }));
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

}  // namespace paged::jinja
