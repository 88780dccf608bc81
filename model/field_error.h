// A field that fails a check: which one and why. What the pure checks of model/ return (the sampling parameters of
// a request, a step sent to a worker); each caller turns it into its own error (InvalidRequest, a caf::error).
#pragma once

#include <string>

namespace paged {

struct FieldError {
  std::string field;    // the field's path, e.g. "top_p" or "seqs[2].block_table[0]"
  std::string message;  // why it fails, a sentence that reads on its own

  /// "field: message".
  std::string describe() const { return field + ": " + message; }
};

}  // namespace paged
