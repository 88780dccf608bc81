// Unicode Normalization Form C (canonical decomposition, then canonical composition), as tokenizer.json's "NFC"
// normalizer applies it.
#pragma once

#include <string>
#include <string_view>

namespace paged::unicode {

/// The NFC of `text`, which must be valid UTF-8 (Unicode 14.0 data, the version of PCRE2 10.42's tables).
std::string nfc(std::string_view text);

}  // namespace paged::unicode
