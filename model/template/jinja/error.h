// How the Jinja internals raise their one error: every syntax and runtime error is a TemplateError.
#pragma once

#include <string>

#include "model/template/jinja/template_error.h"

namespace paged::jinja {

/// Throws TemplateError(message).
[[noreturn]] inline void fail(const std::string& message) { throw TemplateError(message); }

}  // namespace paged::jinja
