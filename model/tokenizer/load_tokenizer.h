// Picks and loads the tokenizer of a Hugging Face model folder.
#pragma once

#include <memory>
#include <string>

#include "model/tokenizer/tokenizer.h"

namespace paged {

/// Loads the tokenizer of a Hugging Face model folder: tokenizer.json (byte-level BPE) when present, otherwise
/// tokenizer.model (SentencePiece). tokenizer_config.json supplies add_bos_token and special tokens.
/// Throws TokenizerError naming what is missing or malformed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

}  // namespace paged
