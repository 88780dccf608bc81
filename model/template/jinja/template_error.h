// The one error of the Jinja subset; jinja.h, the public face, includes it.
#pragma once

#include <stdexcept>

namespace paged::jinja {

/// A template that does not parse, or fails while rendering (including raise_exception("...") in the template,
/// whose message is the error's what()).
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace paged::jinja
