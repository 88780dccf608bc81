// A Jinja subset interpreter for chat templates. It follows the semantics of the @huggingface/jinja renderer (the
// one transformers.js uses, with lstrip_blocks and trim_blocks on), which is what the tests compare against
// byte for byte. Two places follow Python's Jinja instead, where that renderer is plainly off: str.strip/lstrip/
// rstrip(chars) strip only `chars` (it ignores the argument), and output made before a break/continue is kept.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control ({%- -%} {{- -}}), set (plain, tuple, namespace attribute,
// block), if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/first/last/length/...),
// break/continue, macro (positional, keyword and default arguments), literals (strings, numbers, lists, tuples,
// dicts), arithmetic, comparisons, and/or/not, in / not in, + and ~ concatenation, slicing, ternaries, filters
// and tests of the chat templates in circulation, string and dict methods, namespace(), range(), raise_exception().
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/template_error.h"

namespace paged::jinja {

/// A parsed template. Immutable after construction; render() may be called from several threads at once.
class Template {
 public:
  /// Parses `source`; throws TemplateError on a syntax error.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  /// Renders with `variables` as the global scope (JSON values; integral numbers become integers). Throws
  /// TemplateError on a runtime error and when the render passes `limits` (model/template/jinja/budget.h).
  std::string render(const boost::json::object& variables, const RenderLimits& limits = {}) const;

 private:
  struct Program;
  std::unique_ptr<Program> program_;
};

}  // namespace paged::jinja
