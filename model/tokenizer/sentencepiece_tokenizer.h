// SentencePiece tokenizer (tokenizer.model: Llama 2, TinyStories) through libsentencepiece.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <boost/json.hpp>

#include "model/tokenizer/tokenizer.h"

namespace paged {

/// The SentencePiece model at `model_path`, with HF LlamaTokenizer's behaviour: BOS prepended when add_bos_token
/// (default true) and EOS when add_eos_token of `tokenizer_config` (the parsed tokenizer_config.json, if any); special
/// pieces written in the text map to their ids; decode drops control/unknown tokens (BOS, EOS and UNK are the special
/// tokens, written as their pieces unless skipped) and the dummy-prefix space of the first piece. Throws TokenizerError
/// when the model cannot be loaded.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_path,
                                                        const std::optional<boost::json::object>& tokenizer_config);

}  // namespace paged
