#include "model/tokenizer/tokenizer.h"

#include "model/unicode/utf8.h"

namespace paged {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens,
                                               std::span<const TokenId> preceding)
    : tok_(&tok), skip_special_tokens_(skip_special_tokens) {
  for (TokenId id : preceding) push(id);  // only where it leaves off matters: the text is dropped
}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string bytes = tok_->token_bytes(id, first_);
  if (bytes.empty() && !skip_special_tokens_) bytes = tok_->special_token_text(id);
  if (bytes.empty()) return {};
  first_ = false;
  pending_ += bytes;
  std::string out;
  pending_.erase(0, utf8::append_replacing_invalid(pending_, false, out));
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  utf8::append_replacing_invalid(pending_, true, out);
  pending_.clear();
  first_ = true;
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  IncrementalDetokenizer d(*this, skip_special_tokens);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.finish();
}

}  // namespace paged
