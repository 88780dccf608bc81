#include "model/template/jinja/globals.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <string>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/error.h"

namespace paged::jinja {
namespace {

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

/// range(stop) or range(start, stop[, step]): the integers, as a list.
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
  // Its length, charged before the list is made (in 128-bit arithmetic: the bounds may be any int64).
  const __int128 stride = step > 0 ? __int128{step} : -__int128{step};
  const __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
  const __int128 length = span <= 0 ? 0 : (span + stride - 1) / stride;
  charge_bytes(static_cast<size_t>(std::min<__int128>(length, __int128{1} << 40)) * sizeof(Value));
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::of_int(i));
  return Value::of(std::move(out));
}

/// namespace(dict or [key, value] pairs, key=value...): a namespace, whose attributes `set` may assign.
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

/// raise_exception(args...): fails with the arguments' strings joined by commas as the message.
Value raise_exception(Args& args, Scope&) {
  std::string message;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i) message += ",";
    message += js_string(args.positional[i]);
  }
  fail(message);
}

}  // namespace

void define_globals(Object& vars) {
  vars.set("false", Value::of(false));
  vars.set("true", Value::of(true));
  vars.set("none", Value::none());
  vars.set("False", Value::of(false));
  vars.set("True", Value::of(true));
  vars.set("None", Value::none());
  vars.set("raise_exception", Value::of(Function(raise_exception)));
  vars.set("range", Value::of(Function(range_fn)));
  vars.set("strftime_now", Value::of(Function(strftime_now)));
  vars.set("namespace", Value::of(Function(namespace_fn)));
}

}  // namespace paged::jinja
