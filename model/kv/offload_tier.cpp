#include "model/kv/offload_tier.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace paged {

OffloadTier::OffloadTier(int32_t num_blocks, int32_t first_host_block)
    : pool_(num_blocks, "cpu tier"), first_host_block_(first_host_block) {
  if (first_host_block < 0) throw std::invalid_argument("cpu tier: negative first host block");
}

std::optional<int32_t> OffloadTier::store(const EvictedContent& content, EvictedContent* dropped) {
  if (pool_.find(content.view())) throw std::logic_error("cpu tier: store() of content it holds already");
  if (pool_.num_free() == 0) return std::nullopt;
  const int32_t block = pool_.allocate(dropped);  // free -> in use; or LRU cached -> dropped -> in use
  pool_.adopt(block, content.view(), content.content_id);
  pool_.release(block);  // in use (registered) -> cached, LRU tail
  return block;
}

void OffloadTier::take(int32_t block) {
  if (pool_.ref_count(block) != 0 || pool_.content_id(block) == 0)
    throw std::logic_error("cpu tier: take() of block " + std::to_string(block) + ", which is not cached");
  pool_.retain(block);  // cached -> in use (ref 1)
  pool_.forget(block);  // unregistered: found no more
  held_.push_back(block);
}

void OffloadTier::discard(int32_t block) {
  if (pool_.ref_count(block) != 0 || pool_.content_id(block) == 0)
    throw std::logic_error("cpu tier: discard() of block " + std::to_string(block) + ", which is not cached");
  pool_.retain(block);
  pool_.forget(block);
  pool_.release(block);  // -> free
}

void OffloadTier::settle() {
  for (int32_t block : held_) pool_.release(block);  // held -> free
  held_.clear();
}

void OffloadTier::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> sorted = held_;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::logic_error("cpu tier: a block is held twice");
  for (int32_t b : held_) {
    if (pool_.ref_count(b) != 1 || pool_.content_id(b) != 0)
      throw std::logic_error("cpu tier: held block " + std::to_string(b) + " is not in use and unregistered");
  }
  if (pool_.num_in_use() != num_held())
    throw std::logic_error("cpu tier: " + std::to_string(pool_.num_in_use()) + " blocks in use, " +
                           std::to_string(num_held()) + " held");
}

}  // namespace paged
