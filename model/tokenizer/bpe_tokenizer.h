// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen2/Qwen3).
#pragma once

#include <memory>
#include <string>

#include "model/tokenizer/tokenizer.h"

namespace paged {

/// Byte-level BPE from `tokenizer_json_path`: model "BPE" (vocab, merges by rank, ignore_merges), normalizer null or
/// NFC, pre_tokenizer Split (Isolated) / ByteLevel / Sequence of them, decoder ByteLevel, added tokens matched
/// first (longest first) and never split. encode(text, true) adds the tokens of a TemplateProcessing post_processor,
/// overridden by add_bos_token / add_eos_token of `tokenizer_config_json_path` (which may not exist); bos and eos
/// come from that config. Throws TokenizerError naming what is missing, malformed or unsupported (e.g. a
/// SentencePiece-style tokenizer.json with byte_fallback).
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& tokenizer_json_path,
                                              const std::string& tokenizer_config_json_path);

}  // namespace paged
