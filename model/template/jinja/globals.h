// The global names every template sees: true/false/none (and True/False/None), range(), namespace(),
// raise_exception() and strftime_now().
#pragma once

#include "model/template/jinja/value.h"

namespace paged::jinja {

/// Sets the global names in `vars` (the variables of a render's global scope, before the caller's own).
void define_globals(Object& vars);

}  // namespace paged::jinja
