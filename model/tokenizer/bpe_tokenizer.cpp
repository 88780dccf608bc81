#include "model/tokenizer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/json_file.h"
#include "model/unicode/nfc.h"
#include "model/unicode/utf8.h"

namespace paged {
namespace {

namespace json = boost::json;

// ---- byte-level alphabet -------------------------------------------------------------------------------------------

// GPT-2's reversible map from bytes to printable characters: the printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) stand for themselves, the other 68 bytes in increasing order for U+0100, U+0101, ... U+0143.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet() {
    byte_of_code_point_.fill(-1);
    char32_t next_unprintable = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(byte) : next_unprintable++;
      byte_of_code_point_[cp] = static_cast<int16_t>(byte);
    }
  }

  /// Raw bytes of a vocabulary string written in this alphabet; nullopt when it has any other character.
  std::optional<std::string> decode(std::string_view token) const {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const utf8::Char c = utf8::next(token.substr(i));
      if (!c.complete || c.code_point >= byte_of_code_point_.size() || byte_of_code_point_[c.code_point] < 0)
        return std::nullopt;
      bytes += static_cast<char>(byte_of_code_point_[c.code_point]);
      i += c.length;
    }
    return bytes;
  }

 private:
  std::array<int16_t, 0x144> byte_of_code_point_;  // -1 where no byte maps
};

// ---- regex ---------------------------------------------------------------------------------------------------------

// A PCRE2 pattern compiled once (UTF, Unicode properties for \p, \s, \w; JIT when available). Matching allocates its
// own match data, so one Regex serves several threads.
class Regex {
 public:
  /// `literal`: the pattern is a plain string to find, not a regular expression.
  Regex(const std::string& pattern, bool literal) : code_(nullptr, pcre2_code_free) {
    const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                              &error_offset, nullptr));
    if (!code_) {
      throw TokenizerError("pre_tokenizer pattern " + pattern + ": " + error_message(error) + " at offset " +
                           std::to_string(error_offset));
    }
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // without JIT support pcre2_match interprets
  }

  /// Calls on_match(begin, end) with the byte range of each successive non-overlapping, non-empty match in `text`,
  /// which must be valid UTF-8.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    if (!match) throw std::bad_alloc();
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    while (start < text.size()) {
      const int rc = pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) throw TokenizerError("pre_tokenizer regex failed: " + error_message(rc));
      const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.get());
      if (range[1] == range[0]) {  // an empty match: search again from the character after it
        if (range[0] == text.size()) return;
        start = range[0] + utf8::next(text.substr(range[0])).length;
        continue;
      }
      on_match(range[0], range[1]);
      start = range[1];
    }
  }

 private:
  static std::string error_message(int error) {
    std::array<PCRE2_UCHAR, 256> text{};
    pcre2_get_error_message(error, text.data(), text.size());
    return reinterpret_cast<const char*>(text.data());
  }

  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code_;
};

// GPT-2's pre-tokenizer pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One stage of the pre-tokenizer, applied to every piece the previous stages produced.
struct PreTokenizeStage {
  bool add_prefix_space = false;  // ByteLevel: prepend " " to a piece that does not start with one (done first)
  std::unique_ptr<Regex> isolate;  // Split "Isolated": the matches and the gaps between them become pieces; null: none
};

// ---- JSON helpers --------------------------------------------------------------------------------------------------

// The member `key` of `object`, or null when it is absent or JSON null.
const json::value* member(const json::object& object, std::string_view key) {
  const json::value* value = object.if_contains(key);
  return value && !value->is_null() ? value : nullptr;
}

bool bool_member(const json::object& object, std::string_view key, bool absent) {
  const json::value* value = member(object, key);
  return value ? value->as_bool() : absent;
}

std::string_view type_of(const json::object& object) { return object.at("type").as_string(); }

// A token named by tokenizer_config.json: a string, an AddedToken object with "content", or absent / null.
std::optional<std::string> config_token(const json::object& config, std::string_view key) {
  const json::value* value = member(config, key);
  if (!value) return std::nullopt;
  if (value->is_string()) return std::string(value->as_string());
  return std::string(value->as_object().at("content").as_string());
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

// ---- the tokenizer -------------------------------------------------------------------------------------------------

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const json::object& tokenizer, const json::object* config) {
    read_model(tokenizer.at("model").as_object());
    read_added_tokens(tokenizer);
    read_normalizer(member(tokenizer, "normalizer"));
    bool byte_level = false;
    if (const json::value* pre_tokenizer = member(tokenizer, "pre_tokenizer"))
      read_pre_tokenizer(pre_tokenizer->as_object(), byte_level);
    if (!byte_level) throw TokenizerError("not a byte-level BPE: the pre_tokenizer has no ByteLevel step");
    const json::value* decoder = member(tokenizer, "decoder");
    if (!decoder || type_of(decoder->as_object()) != "ByteLevel")
      throw TokenizerError("not a byte-level BPE: the decoder is not ByteLevel");
    if (const json::value* post_processor = member(tokenizer, "post_processor"))
      read_post_processor(post_processor->as_object());
    if (config) read_config(*config);
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special) const override {
    if (!utf8::is_valid(text)) throw TokenizerError("text is not valid UTF-8");
    std::vector<TokenId> ids;
    if (add_special) ids = special_prefix_;
    size_t section_start = 0;
    for (size_t pos = 0; pos < text.size();) {
      const AddedToken* token = added_token_at(text, pos);
      if (!token) {
        ++pos;
        continue;
      }
      size_t section_end = pos;
      if (token->lstrip) {
        while (section_end > section_start && utf8::is_ascii_space(text[section_end - 1])) --section_end;
      }
      encode_section(text.substr(section_start, section_end - section_start), ids);
      ids.push_back(token->id);
      pos += token->content.size();
      if (token->rstrip) {
        while (pos < text.size() && utf8::is_ascii_space(text[pos])) ++pos;
      }
      section_start = pos;
    }
    encode_section(text.substr(section_start), ids);
    if (add_special) ids.insert(ids.end(), special_suffix_.begin(), special_suffix_.end());
    return ids;
  }

  std::string token_bytes(TokenId id, bool /*first: only SentencePiece uses it*/) const override {
    return id >= 0 && static_cast<size_t>(id) < bytes_of_id_.size() ? bytes_of_id_[id] : std::string();
  }

  /// The content of an added token marked "special".
  std::string special_token_text(TokenId id) const override {
    auto it = special_text_of_id_.find(id);
    return it == special_text_of_id_.end() ? std::string() : it->second;
  }

  /// The highest id that tokenizer.json names (vocab or added token) + 1.
  int32_t vocab_size() const override { return static_cast<int32_t>(bytes_of_id_.size()); }
  TokenId bos_id() const override { return bos_id_; }
  std::vector<TokenId> eos_ids() const override {
    return eos_id_ >= 0 ? std::vector<TokenId>{eos_id_} : std::vector<TokenId>{};
  }
  TokenId token_to_id(std::string_view token) const override {
    auto it = id_of_token_.find(token);
    return it == id_of_token_.end() ? -1 : it->second;
  }

 private:
  struct Merge {
    uint32_t rank;  // position in the merges list: lower merges first
    TokenId merged;
  };
  struct AddedToken {
    std::string content;
    TokenId id;
    bool lstrip;  // ASCII whitespace before the token is dropped
    bool rstrip;  // ASCII whitespace after the token is dropped
  };

  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // Sets id -> bytes, growing the table (ids missing from the files decode to "").
  void set_bytes_of_id(TokenId id, std::string bytes) {
    if (id < 0) throw TokenizerError("negative token id " + std::to_string(id));
    if (static_cast<size_t>(id) >= bytes_of_id_.size()) bytes_of_id_.resize(static_cast<size_t>(id) + 1);
    bytes_of_id_[id] = std::move(bytes);
  }

  void read_model(const json::object& model) {
    if (type_of(model) != "BPE") throw TokenizerError("model type " + std::string(type_of(model)) + " is not BPE");
    if (bool_member(model, "byte_fallback", false)) throw TokenizerError("BPE with byte_fallback is not supported");
    for (std::string_view affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json::value* value = member(model, affix);
      if (value && !value->as_string().empty()) throw TokenizerError("BPE " + std::string(affix) + " is not supported");
    }
    ignore_merges_ = bool_member(model, "ignore_merges", false);

    const ByteLevelAlphabet alphabet;
    for (const auto& [token, id_value] : model.at("vocab").as_object()) {
      const auto id = static_cast<TokenId>(id_value.to_number<int32_t>());
      id_of_token_.insert_or_assign(std::string(token), id);
      std::optional<std::string> bytes = alphabet.decode(token);
      // A token outside the byte-level alphabet can never come out of encode; it decodes to its own UTF-8.
      if (bytes) id_of_bytes_.insert_or_assign(*bytes, id);
      set_bytes_of_id(id, bytes ? *bytes : std::string(token));
    }
    id_of_byte_.fill(-1);
    for (int byte = 0; byte < 256; ++byte) {
      auto it = id_of_bytes_.find(std::string(1, static_cast<char>(byte)));
      if (it != id_of_bytes_.end()) id_of_byte_[byte] = it->second;
    }

    const json::array& merges = model.at("merges").as_array();
    merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      std::string_view left, right;
      if (merges[rank].is_string()) {
        const std::string_view line = merges[rank].as_string();
        const size_t space = line.find(' ');
        if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
          throw TokenizerError("merge \"" + std::string(line) + "\" is not two tokens separated by a space");
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else {
        const json::array& pair = merges[rank].as_array();
        if (pair.size() != 2) throw TokenizerError("merge #" + std::to_string(rank) + " is not a pair");
        left = pair[0].as_string();
        right = pair[1].as_string();
      }
      const TokenId left_id = vocab_id(left), right_id = vocab_id(right);
      const TokenId merged = vocab_id(std::string(left) + std::string(right));
      merges_.insert_or_assign(pair_key(left_id, right_id), Merge{static_cast<uint32_t>(rank), merged});
    }
  }

  TokenId vocab_id(std::string_view token) const {
    auto it = id_of_token_.find(token);
    if (it == id_of_token_.end()) throw TokenizerError("merge token \"" + std::string(token) + "\" is not in the vocab");
    return it->second;
  }

  void read_added_tokens(const json::object& tokenizer) {
    const json::value* list = member(tokenizer, "added_tokens");
    if (!list) return;
    for (const json::value& entry : list->as_array()) {
      const json::object& object = entry.as_object();
      AddedToken token{std::string(object.at("content").as_string()),
                       static_cast<TokenId>(object.at("id").to_number<int32_t>()), bool_member(object, "lstrip", false),
                       bool_member(object, "rstrip", false)};
      if (token.content.empty()) continue;
      const bool special = bool_member(object, "special", false);
      set_bytes_of_id(token.id, special ? std::string() : token.content);
      if (special) special_text_of_id_.insert_or_assign(token.id, token.content);
      id_of_token_.insert_or_assign(token.content, token.id);
      added_tokens_.push_back(std::move(token));
    }
    for (size_t i = 0; i < added_tokens_.size(); ++i)
      added_by_first_byte_[static_cast<unsigned char>(added_tokens_[i].content[0])].push_back(i);
    for (auto& candidates : added_by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
        return added_tokens_[a].content.size() > added_tokens_[b].content.size();
      });
    }
  }

  // The longest added token that `text` has at `pos`, or null.
  const AddedToken* added_token_at(std::string_view text, size_t pos) const {
    for (size_t index : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& token = added_tokens_[index];
      if (text.substr(pos).starts_with(token.content)) return &token;
    }
    return nullptr;
  }

  void read_normalizer(const json::value* normalizer) {
    if (!normalizer) return;
    const json::object& object = normalizer->as_object();
    const std::string_view type = type_of(object);
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence") {
      for (const json::value& step : object.at("normalizers").as_array()) read_normalizer(&step);
    } else {
      throw TokenizerError("normalizer " + std::string(type) + " is not supported");
    }
  }

  void read_pre_tokenizer(const json::object& pre_tokenizer, bool& byte_level) {
    const std::string_view type = type_of(pre_tokenizer);
    if (type == "Sequence") {
      for (const json::value& step : pre_tokenizer.at("pretokenizers").as_array())
        read_pre_tokenizer(step.as_object(), byte_level);
    } else if (type == "Split") {
      const std::string_view behavior = pre_tokenizer.at("behavior").as_string();
      if (behavior != "Isolated") throw TokenizerError("Split behavior " + std::string(behavior) + " is not supported");
      if (bool_member(pre_tokenizer, "invert", false)) throw TokenizerError("Split with invert is not supported");
      const json::object& pattern = pre_tokenizer.at("pattern").as_object();
      const bool literal = pattern.contains("String");
      const std::string text(literal ? pattern.at("String").as_string() : pattern.at("Regex").as_string());
      stages_.push_back({false, std::make_unique<Regex>(text, literal)});
    } else if (type == "ByteLevel") {
      byte_level = true;
      PreTokenizeStage stage{bool_member(pre_tokenizer, "add_prefix_space", true), nullptr};
      if (bool_member(pre_tokenizer, "use_regex", true))
        stage.isolate = std::make_unique<Regex>(std::string(kGpt2Pattern), false);
      if (stage.add_prefix_space || stage.isolate) stages_.push_back(std::move(stage));
    } else {
      throw TokenizerError("pre_tokenizer " + std::string(type) + " is not supported");
    }
  }

  void read_post_processor(const json::object& post_processor) {
    const std::string_view type = type_of(post_processor);
    if (type == "Sequence") {
      for (const json::value& step : post_processor.at("processors").as_array()) read_post_processor(step.as_object());
    } else if (type == "TemplateProcessing") {
      const json::object& special_tokens = post_processor.at("special_tokens").as_object();
      bool after_sequence = false;
      for (const json::value& item : post_processor.at("single").as_array()) {
        const json::object& piece = item.as_object();
        if (piece.contains("Sequence")) {
          after_sequence = true;
          continue;
        }
        const json::string& name = piece.at("SpecialToken").as_object().at("id").as_string();
        for (const json::value& id : special_tokens.at(name).as_object().at("ids").as_array())
          (after_sequence ? special_suffix_ : special_prefix_).push_back(id.to_number<TokenId>());
      }
    } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets
      throw TokenizerError("post_processor " + std::string(type) + " is not supported");
    }
  }

  // bos/eos, and add_bos_token / add_eos_token, which decide over the post_processor whether encode adds them.
  void read_config(const json::object& config) {
    bos_id_ = config_token_id(config, "bos_token");
    eos_id_ = config_token_id(config, "eos_token");
    if (const json::value* add_bos = member(config, "add_bos_token")) {
      std::erase(special_prefix_, bos_id_);
      if (add_bos->as_bool() && bos_id_ >= 0) special_prefix_.insert(special_prefix_.begin(), bos_id_);
    }
    if (const json::value* add_eos = member(config, "add_eos_token")) {
      std::erase(special_suffix_, eos_id_);
      if (add_eos->as_bool() && eos_id_ >= 0) special_suffix_.push_back(eos_id_);
    }
  }

  TokenId config_token_id(const json::object& config, std::string_view key) const {
    const std::optional<std::string> token = config_token(config, key);
    if (!token) return -1;
    const TokenId id = token_to_id(*token);
    if (id < 0) throw TokenizerError(std::string(key) + " \"" + *token + "\" is not a token");
    return id;
  }

  // Appends the ids of text that holds no added token: normalized, pre-tokenized, each piece merged.
  void encode_section(std::string_view section, std::vector<TokenId>& ids) const {
    if (section.empty()) return;
    std::vector<std::string> pieces{nfc_ ? unicode::nfc(section) : std::string(section)};
    for (const PreTokenizeStage& stage : stages_) {
      std::vector<std::string> split;
      for (std::string& piece : pieces) {
        if (stage.add_prefix_space && piece.front() != ' ') piece.insert(0, 1, ' ');
        if (!stage.isolate) {
          split.push_back(std::move(piece));
          continue;
        }
        size_t gap_start = 0;
        stage.isolate->for_each_match(piece, [&](size_t begin, size_t end) {
          if (begin > gap_start) split.emplace_back(piece, gap_start, begin - gap_start);
          split.emplace_back(piece, begin, end - begin);
          gap_start = end;
        });
        if (gap_start < piece.size()) split.emplace_back(piece, gap_start);
      }
      pieces = std::move(split);
    }
    for (const std::string& piece : pieces) append_piece_ids(piece, ids);
  }

  void append_piece_ids(std::string_view piece, std::vector<TokenId>& ids) const {
    if (ignore_merges_) {
      if (auto it = id_of_bytes_.find(piece); it != id_of_bytes_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    {
      std::lock_guard lock(cache_mutex_);
      if (auto it = cached_pieces_.find(piece); it != cached_pieces_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<TokenId> merged = merge(piece);
    ids.insert(ids.end(), merged.begin(), merged.end());
    std::lock_guard lock(cache_mutex_);
    if (cached_pieces_.size() >= kMaxCachedPieces) cached_pieces_.clear();
    cached_pieces_.emplace(std::string(piece), std::move(merged));
  }

  // BPE: starting from one token per byte, repeatedly merges the adjacent pair of lowest rank (leftmost on ties).
  std::vector<TokenId> merge(std::string_view piece) const {
    struct Symbol {
      TokenId id;  // -1 once merged into its left neighbour
      int prev, next;
    };
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    for (unsigned char byte : piece) {
      if (id_of_byte_[byte] < 0) continue;  // as HF without unk_token: a byte missing from the vocab is dropped
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({id_of_byte_[byte], index - 1, index + 1});
    }
    if (symbols.empty()) return {};
    symbols.back().next = -1;

    struct Candidate {
      uint32_t rank;
      int left;  // index of the left symbol
      TokenId left_id, right_id, merged;  // a candidate is stale once either symbol has changed
    };
    auto later = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> candidates(later);
    auto consider = [&](int left) {
      const int right = symbols[left].next;
      if (right < 0) return;
      auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
      if (it != merges_.end())
        candidates.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged});
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
    while (!candidates.empty()) {
      const Candidate best = candidates.top();
      candidates.pop();
      Symbol& left = symbols[best.left];
      if (left.id != best.left_id || left.next < 0 || symbols[left.next].id != best.right_id) continue;
      Symbol& right = symbols[left.next];
      left.id = best.merged;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = best.left;
      right.id = -1;
      if (left.prev >= 0) consider(left.prev);
      consider(best.left);
    }
    std::vector<TokenId> ids;
    for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
    return ids;
  }

  static constexpr size_t kMaxCachedPieces = 1 << 16;

  StringMap<TokenId> id_of_token_;              // string form in tokenizer.json (vocab and added tokens) -> id
  StringMap<TokenId> id_of_bytes_;              // raw bytes of a byte-level vocab token -> id
  std::array<TokenId, 256> id_of_byte_{};       // the single-byte tokens, -1 where absent
  std::unordered_map<uint64_t, Merge> merges_;  // pair_key(left, right) -> merge
  bool ignore_merges_ = false;                  // a piece that is a whole vocab token is taken as it is
  std::vector<std::string> bytes_of_id_;        // what token_bytes returns
  std::unordered_map<TokenId, std::string> special_text_of_id_;  // what special_token_text returns
  std::vector<AddedToken> added_tokens_;
  std::array<std::vector<size_t>, 256> added_by_first_byte_;  // indices into added_tokens_, longest content first
  bool nfc_ = false;
  std::vector<PreTokenizeStage> stages_;
  std::vector<TokenId> special_prefix_, special_suffix_;  // what encode(text, true) adds
  TokenId bos_id_ = -1, eos_id_ = -1;

  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<TokenId>> cached_pieces_;  // merge() results, cleared when full
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& tokenizer_json_path,
                                              const std::string& tokenizer_config_json_path) {
  const json::object tokenizer = read_json_object<TokenizerError>(tokenizer_json_path);
  std::optional<json::object> config;
  if (std::filesystem::exists(tokenizer_config_json_path))
    config = read_json_object<TokenizerError>(tokenizer_config_json_path);
  try {
    return std::make_unique<BpeTokenizer>(tokenizer, config ? &*config : nullptr);
  } catch (const TokenizerError& e) {
    throw TokenizerError(tokenizer_json_path + ": " + e.what());
  } catch (const std::exception& e) {  // Boost.JSON's errors for missing members or values of the wrong kind
    throw TokenizerError(tokenizer_json_path + " or its tokenizer_config.json is malformed: " + e.what());
  }
}

}  // namespace paged
