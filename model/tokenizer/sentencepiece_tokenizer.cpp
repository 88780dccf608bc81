#include "model/tokenizer/sentencepiece_tokenizer.h"
#include "model/unicode/utf8.h"

#include <sentencepiece_processor.h>

#include <map>

namespace paged {
namespace {

namespace json = boost::json;

/// SentencePiece `tokenizer.model` (Llama 2, TinyStories) through libsentencepiece, with HF LlamaTokenizer's
/// behaviour: BOS prepended when add_bos_token (default true), decode drops control/unknown tokens (BOS, EOS and UNK
/// are the special ones) and the dummy-prefix space of the first piece.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_path, const std::optional<json::object>& config) {
    auto status = sp_.Load(model_path);
    if (!status.ok()) throw TokenizerError(model_path + ": " + status.ToString());
    for (int id : {sp_.bos_id(), sp_.eos_id(), sp_.unk_id()})
      if (id >= 0) specials_.emplace(sp_.IdToPiece(id), id);
    if (config) {
      if (auto it = config->find("add_bos_token"); it != config->end() && it->value().is_bool())
        add_bos_ = it->value().as_bool();
      if (auto it = config->find("add_eos_token"); it != config->end() && it->value().is_bool())
        add_eos_ = it->value().as_bool();
    }
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special) const override {
    if (!utf8::is_valid(text)) throw TokenizerError("text is not valid UTF-8");
    std::vector<TokenId> out;
    if (add_special && add_bos_ && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    // Special tokens written in the text (a chat template's "<s>") are split out first and map to their ids, as
    // HF's LlamaTokenizer does; each piece between them is encoded by SentencePiece on its own.
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t best = std::string_view::npos;
      const std::string* special = nullptr;
      for (const auto& [piece, id] : specials_) {
        size_t at = text.find(piece, pos);
        if (at < best || (at == best && at != std::string_view::npos && piece.size() > special->size())) {
          best = at;
          special = &piece;
        }
      }
      std::string_view segment = text.substr(pos, best == std::string_view::npos ? std::string_view::npos : best - pos);
      if (!segment.empty()) {
        std::vector<int> ids;
        auto status = sp_.Encode(segment, &ids);
        if (!status.ok()) throw TokenizerError("sentencepiece: " + status.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
      }
      if (best == std::string_view::npos) break;
      out.push_back(specials_.at(*special));
      pos = best + special->size();
    }
    if (add_special && add_eos_ && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
    return out;
  }

  std::string token_bytes(TokenId id, bool first) const override {
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsUnused(id)) return {};
    const std::string& piece = sp_.IdToPiece(id);
    if (sp_.IsByte(id)) return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    std::string out;
    constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    if (first && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  std::string special_token_text(TokenId id) const override {
    const bool special = id >= 0 && (id == sp_.bos_id() || id == sp_.eos_id() || id == sp_.unk_id());
    return special ? sp_.IdToPiece(id) : std::string();
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  TokenId bos_id() const override { return sp_.bos_id(); }
  std::vector<TokenId> eos_ids() const override {
    return sp_.eos_id() >= 0 ? std::vector<TokenId>{sp_.eos_id()} : std::vector<TokenId>{};
  }
  TokenId token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(token);
    return id == sp_.unk_id() && token != sp_.IdToPiece(sp_.unk_id()) ? -1 : id;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::map<std::string, TokenId> specials_;  // BOS, EOS, UNK pieces as they may appear in text
  bool add_bos_ = true;
  bool add_eos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_path,
                                                        const std::optional<json::object>& tokenizer_config) {
  return std::make_unique<SentencePieceTokenizer>(model_path, tokenizer_config);
}

}  // namespace paged
