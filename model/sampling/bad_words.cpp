#include "model/sampling/bad_words.h"

#include <algorithm>

namespace paged {

std::vector<std::vector<TokenId>> bad_words_token_ids(const Tokenizer& tokenizer, std::span<const std::string> words) {
  std::vector<std::vector<TokenId>> out;
  for (const std::string& word : words) {
    const std::string bare = word.substr(std::min(word.size(), word.find_first_not_of(" \t\n\r\f\v")));
    std::vector<TokenId> alone = tokenizer.encode(bare, false);
    if (alone.empty()) throw TokenizerError("the bad word '" + word + "' has no tokens");
    std::vector<TokenId> spaced = tokenizer.encode(" " + bare, false);
    const bool new_spelling = spaced.size() == alone.size() && spaced.front() != alone.front();
    out.push_back(std::move(alone));
    if (new_spelling) out.push_back(std::move(spaced));
  }
  return out;
}

void append_bad_word_bans(std::span<const std::vector<TokenId>> words, std::span<const TokenId> newest,
                          std::vector<TokenId>& banned) {
  for (const std::vector<TokenId>& word : words) {
    if (word.empty() || word.size() > newest.size() + 1) continue;
    const size_t prefix = word.size() - 1;
    bool ends_output = true;
    for (size_t i = 0; i < prefix && ends_output; ++i) ends_output = newest[newest.size() - 1 - i] == word[prefix - 1 - i];
    if (ends_output) banned.push_back(word.back());
  }
}

}  // namespace paged
