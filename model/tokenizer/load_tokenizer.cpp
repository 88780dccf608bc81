#include "model/tokenizer/load_tokenizer.h"

#include <boost/json.hpp>
#include <filesystem>
#include <optional>

#include "model/json_file.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/sentencepiece_tokenizer.h"

namespace paged {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(dir / "tokenizer.json")) {
    // Byte-level BPE (Llama 3, Qwen, GPT-2). A SentencePiece-style tokenizer.json (Llama 2) falls back to
    // tokenizer.model when that is present.
    try {
      return make_bpe_tokenizer((dir / "tokenizer.json").string(), config_path.string());
    } catch (const TokenizerError&) {
      if (!fs::exists(dir / "tokenizer.model")) throw;
    }
  }
  if (fs::exists(dir / "tokenizer.model")) {
    std::optional<boost::json::object> config;
    if (fs::exists(config_path)) config = read_json_object<TokenizerError>(config_path);
    return make_sentencepiece_tokenizer((dir / "tokenizer.model").string(), config);
  }
  throw TokenizerError("no tokenizer in " + model_dir + " (expected tokenizer.json or tokenizer.model)");
}

}  // namespace paged
