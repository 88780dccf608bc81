// A request's structured output (SamplingParams::structured) compiled to its grammar.
#pragma once

#include <memory>

#include "model/constraint/grammar.h"
#include "model/sampling/sampling_params.h"

namespace paged::constraint {

/// The grammar `s` asks for (kind none: null). Throws GrammarError naming what cannot be compiled or enforced.
std::shared_ptr<const Grammar> compile_structured_output(const StructuredOutput& s);

}  // namespace paged::constraint
