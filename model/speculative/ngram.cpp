#include "model/speculative/ngram.h"

#include <algorithm>
#include <stdexcept>

namespace paged {

std::string NgramSpeculation::error() const {
  if (!enabled()) return num_speculative_tokens < 0 ? "num_speculative_tokens must be positive" : "";
  if (num_speculative_tokens > kMaxSpeculativeTokens)
    return "num_speculative_tokens must be in [1, " + std::to_string(kMaxSpeculativeTokens) + "]";
  if (prompt_lookup_min < 1) return "prompt_lookup_min must be at least 1";
  if (prompt_lookup_max < prompt_lookup_min) return "prompt_lookup_max must be at least prompt_lookup_min";
  if (prompt_lookup_max > 64) return "prompt_lookup_max must be at most 64";
  return "";
}

std::vector<TokenId> propose_ngram_drafts(std::span<const TokenId> tokens, const NgramSpeculation& config,
                                          int max_drafts) {
  const int n = static_cast<int>(tokens.size());
  if (max_drafts <= 0 || n < config.prompt_lookup_min + 1) return {};
  const int longest = std::min(config.prompt_lookup_max, n - 1);
  // Scanning earlier ends j from the newest: the length of the run ending at j that equals the newest tokens. The
  // first j to reach `longest` wins at once; otherwise the first of the longest run found.
  int best_end = -1, best_len = config.prompt_lookup_min - 1;
  for (int j = n - 2; j >= 0 && best_len < longest; --j) {
    int len = 0;
    while (len < longest && len <= j && tokens[j - len] == tokens[n - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = j;
    }
  }
  if (best_end < 0) return {};
  const int first = best_end + 1, count = std::min(max_drafts, n - first);
  return {tokens.begin() + first, tokens.begin() + first + count};
}

int accepted_drafts(std::span<const TokenId> drafts, std::span<const TokenId> sampled) {
  if (sampled.size() != drafts.size() + 1)
    throw std::invalid_argument("accepted_drafts: " + std::to_string(sampled.size()) + " samples for " +
                                std::to_string(drafts.size()) + " drafts");
  size_t a = 0;
  while (a < drafts.size() && sampled[a] == drafts[a]) ++a;
  return static_cast<int>(a);
}

}  // namespace paged
