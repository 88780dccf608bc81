#include "model/tokenizer/tokenizer.h"

#include "model/unicode/utf8.h"

namespace paged {

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string bytes = tok_->token_bytes(id, first_);
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

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  IncrementalDetokenizer d(*this);
  std::string out;
  for (TokenId id : ids) out += d.push(id);
  return out + d.finish();
}

}  // namespace paged
