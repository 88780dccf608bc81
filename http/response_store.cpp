#include "http/response_store.h"

#include <algorithm>
#include <charconv>

namespace paged::openai {

namespace json = boost::json;

std::shared_ptr<void> ResponseStore::reserve(const std::string& id, const std::string& owner) {
  if (capacity_ == 0) return nullptr;
  const std::lock_guard lock(mutex_);
  if (by_id_.count(id) || held_.count(id)) return nullptr;
  const uint64_t serial = ++next_serial_;
  held_.emplace(id, Held{owner, serial});
  // A non-null handle whose end lets go of the hold (the store outlives the requests that hold its ids).
  return std::shared_ptr<void>(this, [this, id, serial](void*) { release(id, serial); });
}

void ResponseStore::release(const std::string& id, uint64_t serial) {
  const std::lock_guard lock(mutex_);
  if (const auto it = held_.find(id); it != held_.end() && it->second.serial == serial) held_.erase(it);
}

bool ResponseStore::put(const std::string& id, const std::string& owner, StoredResponse response) {
  if (capacity_ == 0) return false;
  const std::lock_guard lock(mutex_);
  if (by_id_.count(id)) return false;
  if (const auto held = held_.find(id); held != held_.end()) {
    if (held->second.owner != owner) return false;
    held_.erase(held);  // stored now: taken as such
  }
  while (by_id_.size() >= capacity_ && !order_.empty()) {
    by_id_.erase(order_.front());  // gone already when it was deleted
    order_.pop_front();
  }
  by_id_.emplace(id, Entry{owner, std::make_shared<const StoredResponse>(std::move(response))});
  order_.push_back(id);
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::find(std::string_view id, std::string_view owner) const {
  const std::lock_guard lock(mutex_);
  const auto it = by_id_.find(id);
  return it == by_id_.end() || it->second.owner != owner ? nullptr : it->second.response;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(std::string_view id, std::string_view owner,
                                                         const std::string& param) const {
  if (auto found = find(id, owner)) return found;
  throw ResponseNotFound("Response with id '" + std::string(id) + "' not found.", param);
}

bool ResponseStore::erase(std::string_view id, std::string_view owner) {
  const std::lock_guard lock(mutex_);
  const auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.owner != owner) return false;
  by_id_.erase(it);
  // Its place in order_ goes too, so that deleted responses do not hold places the live ones need.
  order_.erase(std::find(order_.begin(), order_.end(), id));
  return true;
}

size_t ResponseStore::size() const {
  const std::lock_guard lock(mutex_);
  return by_id_.size();
}

json::object input_items_page(const StoredResponse& stored,
                              const std::vector<std::pair<std::string, std::string>>& params) {
  int64_t limit = 20;
  bool ascending = false;
  std::string after;
  for (const auto& [name, value] : params) {
    if (name == "limit") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), limit);
      if (ec != std::errc() || end != value.data() + value.size() || limit < 1 || limit > 100)
        throw InvalidRequest("'limit' must be an integer from 1 to 100", "limit");
    } else if (name == "order") {
      if (value != "asc" && value != "desc") throw InvalidRequest("'order' must be asc or desc", "order");
      ascending = value == "asc";
    } else if (name == "after") {
      after = value;
    } else {
      throw InvalidRequest("'" + name + "' is not supported by this server (limit, order, after)", name);
    }
  }
  std::vector<const json::value*> items;
  for (const json::value& item : stored.input_items) items.push_back(&item);
  if (!ascending) std::reverse(items.begin(), items.end());
  size_t first = 0;
  if (!after.empty()) {
    const auto it = std::find_if(items.begin(), items.end(),
                                 [&](const json::value* item) { return item->at("id").as_string() == after; });
    if (it == items.end()) throw InvalidRequest("'after' names no input item of this response", "after");
    first = static_cast<size_t>(it - items.begin()) + 1;
  }
  json::array data;
  for (size_t i = first; i < items.size() && data.size() < static_cast<size_t>(limit); ++i) data.push_back(*items[i]);
  const bool has_more = first + data.size() < items.size();
  json::value first_id = data.empty() ? json::value(nullptr) : data.front().at("id");
  json::value last_id = data.empty() ? json::value(nullptr) : data.back().at("id");
  return json::object{{"object", "list"}, {"data", std::move(data)}, {"first_id", std::move(first_id)},
                      {"last_id", std::move(last_id)}, {"has_more", has_more}};
}

}  // namespace paged::openai
