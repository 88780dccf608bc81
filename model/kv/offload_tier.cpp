#include "model/kv/offload_tier.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace paged {

OffloadTier::OffloadTier(int32_t num_blocks, int32_t first_host_block)
    : pool_(num_blocks, "cpu tier"), first_host_block_(first_host_block), fresh_(std::max(num_blocks, 0), 0) {
  if (first_host_block < 0) throw std::invalid_argument("cpu tier: negative first host block");
}

std::optional<int32_t> OffloadTier::take_block(EvictedContent* dropped, bool* on_host) {
  if (pool_.num_free() == 0) return std::nullopt;
  EvictedContent lost;
  const int32_t block = pool_.allocate(&lost);  // free -> in use; or LRU cached -> dropped -> in use
  if (lost.content_id != 0) {
    if (on_host) *on_host = !fresh_[block];
    if (dropped) *dropped = std::move(lost);
  }
  return block;
}

std::optional<int32_t> OffloadTier::store(const EvictedContent& content, EvictedContent* dropped, bool* on_host) {
  if (pool_.find(content.view())) throw std::logic_error("cpu tier: store() of content it holds already");
  const std::optional<int32_t> block = take_block(dropped, on_host);
  if (!block) return std::nullopt;
  pool_.adopt(*block, content.view(), content.content_id);
  pool_.release(*block);  // in use (registered) -> cached, LRU tail
  fresh_[*block] = 1;
  return block;
}

std::optional<int32_t> OffloadTier::stage(EvictedContent* dropped, bool* on_host) {
  const std::optional<int32_t> block = take_block(dropped, on_host);
  if (block) staged_.push_back(*block);
  return block;
}

void OffloadTier::fill(int32_t block, const BlockContent& content, uint64_t content_id) {
  auto it = std::find(staged_.begin(), staged_.end(), block);
  if (it == staged_.end()) throw std::logic_error("cpu tier: fill() of block " + std::to_string(block) + ", not staged");
  staged_.erase(it);
  pool_.adopt(block, content, content_id);
  pool_.release(block);  // -> cached, LRU tail
}

void OffloadTier::unstage(int32_t block) {
  auto it = std::find(staged_.begin(), staged_.end(), block);
  if (it == staged_.end()) throw std::logic_error("cpu tier: unstage() of block " + std::to_string(block) + ", not staged");
  staged_.erase(it);
  pool_.release(block);  // -> free
}

void OffloadTier::touch(int32_t block) {
  if (pool_.ref_count(block) != 0 || pool_.content_id(block) == 0)
    throw std::logic_error("cpu tier: touch() of block " + std::to_string(block) + ", which is not cached");
  pool_.retain(block);
  pool_.release(block);  // -> cached, LRU tail
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
  std::fill(fresh_.begin(), fresh_.end(), 0);
}

void OffloadTier::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> sorted = held_;
  sorted.insert(sorted.end(), staged_.begin(), staged_.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::logic_error("cpu tier: a block is held or staged twice");
  for (int32_t b : sorted) {
    if (pool_.ref_count(b) != 1 || pool_.content_id(b) != 0)
      throw std::logic_error("cpu tier: held block " + std::to_string(b) + " is not in use and unregistered");
  }
  if (pool_.num_in_use() != static_cast<int32_t>(sorted.size()))
    throw std::logic_error("cpu tier: " + std::to_string(pool_.num_in_use()) + " blocks in use, " +
                           std::to_string(sorted.size()) + " held or staged");
}

}  // namespace paged
