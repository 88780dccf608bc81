// The interpreter: walks a program's tree over values, in nested scopes.
#pragma once

#include <string>
#include <string_view>

#include "model/template/jinja/ast.h"
#include "model/template/jinja/value.h"

namespace paged::jinja {

/// The variables of one scope; lookups fall through to the enclosing ones.
struct Scope {
  explicit Scope(Scope* parent_scope = nullptr) : parent(parent_scope) {}
  Scope* parent;
  Object vars;
  /// The innermost variable called `name`, or undefined.
  Value lookup(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent) {
      if (const Value* v = s->vars.find(name)) return *v;
    }
    return {};
  }
};

/// The output of `program` run in `global`. Throws TemplateError on a runtime error (a break or continue outside
/// a loop included).
std::string render(const Program& program, Scope& global);

}  // namespace paged::jinja
