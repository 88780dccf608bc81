#include "model/tokenizer/load_tokenizer.h"

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/sentencepiece_tokenizer.h"

namespace paged {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

std::optional<json::object> read_optional_json(const fs::path& p) {
  if (!fs::exists(p)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  json::value v = json::parse(ss.str(), ec);
  if (ec || !v.is_object()) throw TokenizerError(p.string() + ": malformed JSON");
  return v.as_object();
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
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
  if (fs::exists(dir / "tokenizer.model"))
    return make_sentencepiece_tokenizer((dir / "tokenizer.model").string(), read_optional_json(config_path));
  throw TokenizerError("no tokenizer in " + model_dir + " (expected tokenizer.json or tokenizer.model)");
}

}  // namespace paged
