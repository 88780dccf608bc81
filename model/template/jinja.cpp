// The Jinja subset, in model/template/jinja/: text (JavaScript string semantics), value, lexer, parser (ast),
// interpreter, with the methods, filters and tests, and globals it calls.
#include "model/template/jinja.h"

#include <boost/json.hpp>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/globals.h"
#include "model/template/jinja/interpreter.h"
#include "model/template/jinja/lexer.h"
#include "model/template/jinja/parser.h"

namespace paged::jinja {

struct Template::Program {
  jinja::Program body;
};

Template::Template(std::string_view source) : program_(std::make_unique<Program>()) {
  program_->body = parse(tokenize(source));
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const boost::json::object& variables, const RenderLimits& limits) const {
  const RenderBudget budget(limits);  // open while the scope's values live: they are charged to it
  Scope global;
  define_globals(global.vars);
  for (const auto& kv : variables) global.vars.set(std::string(kv.key()), from_json(kv.value()));
  return jinja::render(program_->body, global);
}

}  // namespace paged::jinja
