// The filters (`x | name(args)`) and tests (`x is name`) of the Jinja subset.
#pragma once

#include <string>

#include "model/template/jinja/value.h"

namespace paged::jinja {

/// `v is name`; `arg` is the compared value of the two-argument tests (equalto/eq, through selectattr). Throws
/// TemplateError for an unknown test, or odd/even on a non-integer.
bool run_test(const std::string& name, const Value& v, const Value* arg = nullptr);

/// `v | name(args)`, called from `scope`. Throws TemplateError for a filter unknown for v's kind or bad arguments.
Value apply_filter(const std::string& name, const Value& v, Args& args, Scope& scope);

}  // namespace paged::jinja
