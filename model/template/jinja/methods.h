// The methods of strings and dicts (`s.strip()`, `d.items()`, ...), and the case mappings the filters share.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "model/template/jinja/value.h"

namespace paged::jinja {

/// ASCII letters to upper case (or lower case when !upper); other bytes unchanged.
std::string ascii_case(std::string s, bool upper);

/// Python's str.title() on ASCII: the first letter of each run of word characters upper-cased.
std::string title_case(std::string s);

/// A string's methods and `length` (str.upper(), "x".startswith(...), ...); undefined for unknown names.
Value string_method(const std::string& s, std::string_view name);

/// A dict's (key, value) pairs, in order, as two-element arrays.
Array dict_items(const Object& o);

/// A dict's methods (get, items, keys, values), bound to `o`; undefined for unknown names.
Value dict_method(const std::shared_ptr<Object>& o, std::string_view name);

}  // namespace paged::jinja
