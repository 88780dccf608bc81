// The responses a server keeps (OpenAI's Responses API with store): what GET /v1/responses/{id} returns, and the
// conversation a later request continues with previous_response_id. In memory and bounded: past `capacity` the
// oldest goes first (a client whose previous_response_id went gets a 404 naming it). Each response is its owner's
// (the API key that stored it, ServerContext::key_owner): another owner finds nothing under its id. Thread-safe; no
// sockets here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "actors/engine_types.h"

namespace paged::openai {

struct StoredResponse {
  boost::json::object response;     // the response object as it was answered
  boost::json::array conversation;  // as chat messages: the earlier turns, this input, the answer (no instructions)
  boost::json::array input_items;   // this request's input as items (GET /v1/responses/{id}/input_items)
};

/// A stored response that is not there (never stored, deleted or pushed out): HTTP 404.
struct ResponseNotFound : InvalidRequest {
  using InvalidRequest::InvalidRequest;
};

class ResponseStore {
 public:
  /// capacity 0: the server keeps nothing (store: true is refused).
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}

  bool enabled() const { return capacity_ > 0; }
  /// Holds `id` for `owner`'s response while it is generated: no other request holds it until put() stores it
  /// or the handle goes (the id is free again). Null when the id is stored or held already, or the store is off.
  std::shared_ptr<void> reserve(const std::string& id, const std::string& owner);
  /// Keeps `response` under `id` for `owner`, pushing out the oldest when full. False (and nothing changes) when the
  /// id is taken (stored, or held by another owner's reserve()) or the store is off.
  bool put(const std::string& id, const std::string& owner, StoredResponse response);
  /// The response `owner` stored under `id`, or null.
  std::shared_ptr<const StoredResponse> find(std::string_view id, std::string_view owner) const;
  /// find(), or throws ResponseNotFound naming `param` (empty: none).
  std::shared_ptr<const StoredResponse> get(std::string_view id, std::string_view owner, const std::string& param) const;
  /// Forgets `owner`'s `id`; false when it was not stored.
  bool erase(std::string_view id, std::string_view owner);
  size_t size() const;

 private:
  struct Entry {
    std::string owner;
    std::shared_ptr<const StoredResponse> response;
  };
  struct Held {  // an id reserve() holds
    std::string owner;
    uint64_t serial;  // which reserve() (a handle lets go of its own hold only)
  };
  void release(const std::string& id, uint64_t serial);
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry, std::less<>> by_id_;
  std::map<std::string, Held, std::less<>> held_;
  uint64_t next_serial_ = 0;
  std::deque<std::string> order_;  // ids oldest first (erased ones are skipped when found gone)
};

/// GET /v1/responses/{id}/input_items: the list object {"object": "list", "data", "first_id", "last_id",
/// "has_more"} of `stored`'s input items, with the query parameters (name, value) limit (1..100, default 20), order
/// ("asc" or "desc", the default: newest first) and after (an item id: the items after it in that order). Throws
/// InvalidRequest naming a parameter it does not know or a bad value.
boost::json::object input_items_page(const StoredResponse& stored,
                                     const std::vector<std::pair<std::string, std::string>>& params);

}  // namespace paged::openai
