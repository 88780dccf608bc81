#include "model/tokenizer.h"

#include <sentencepiece_processor.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "model/bpe_tokenizer.h"

namespace paged {
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 prefix of the character starting at s[0] (Unicode's "maximal subpart"):
// returns {bytes examined, complete}. complete=false with bytes == s.size() means "valid so far, needs more bytes".
// complete=false with bytes < s.size() means invalid after `bytes` bytes (at least 1 is consumed).
struct CharScan {
  size_t len;
  bool complete;
  bool needs_more;
};

CharScan scan_char(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;        // no overlongs
    if (b0 == 0xED) hi = 0x9F;        // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;        // <= U+10FFFF
  } else {
    return {1, false, false};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {i, false, true};
    const auto b = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {i, false, false};
  }
  return {need, true, false};
}

// Appends to `out` every complete character of `bytes`, invalid subparts as U+FFFD; returns how many bytes were
// consumed (an incomplete tail is left unless `final`).
size_t emit_utf8(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    CharScan c = scan_char(bytes.substr(i));
    if (c.complete) {
      out.append(bytes.substr(i, c.len));
    } else if (c.needs_more && !final) {
      break;
    } else {
      out.append(kReplacement);
    }
    i += c.len;
  }
  return i;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    CharScan c = scan_char(s.substr(i));
    if (!c.complete) return false;
    i += c.len;
  }
  return true;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string bytes = tok_->token_bytes(id, first_);
  if (bytes.empty()) return {};
  first_ = false;
  pending_ += bytes;
  std::string out;
  pending_.erase(0, emit_utf8(pending_, false, out));
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  emit_utf8(pending_, true, out);
  pending_.clear();
  first_ = true;
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  IncrementalDetokenizer d(*this);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.finish();
}

namespace {

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

/// SentencePiece `tokenizer.model` (Llama 2, TinyStories) through libsentencepiece, with HF LlamaTokenizer's
/// behaviour: BOS prepended when add_bos_token (default true), decode drops control/unknown tokens and the
/// dummy-prefix space of the first piece.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const fs::path& model_path, const std::optional<json::object>& config) {
    auto status = sp_.Load(model_path.string());
    if (!status.ok()) throw TokenizerError(model_path.string() + ": " + status.ToString());
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
    if (!is_valid_utf8(text)) throw TokenizerError("text is not valid UTF-8");
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
    return std::make_unique<SentencePieceTokenizer>(dir / "tokenizer.model", read_optional_json(config_path));
  throw TokenizerError("no tokenizer in " + model_dir + " (expected tokenizer.json or tokenizer.model)");
}

}  // namespace paged
