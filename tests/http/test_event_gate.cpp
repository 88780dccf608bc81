// EventGate: the engine's callbacks reach a sink only while the gate is open, and the sink (what holds a session's
// executor and response) is destroyed on the engine's side only while the gate is open, never after close().
#include <catch2/catch.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "http/server_context.h"

using paged::server::EventGate;

namespace {

// A sink that counts its calls and whose captured token tells whether it still exists.
struct Probe {
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  std::weak_ptr<int> alive = calls;
  std::function<void(int)> sink() {
    return [calls = calls](int v) { *calls += v; };
  }
};

}  // namespace

TEST_CASE("EventGate runs a guarded sink while open and drops it with the engine's callback", "[http]") {
  auto gate = std::make_shared<EventGate>();
  Probe probe;
  auto callback = gate->guard<int>(probe.sink());
  probe.calls.reset();  // only the gate keeps it now
  REQUIRE_FALSE(probe.alive.expired());
  callback(2);
  auto copy = callback;  // copies share one ticket
  copy(3);
  CHECK(*probe.alive.lock() == 5);
  callback = nullptr;
  CHECK_FALSE(probe.alive.expired());  // a copy still lives
  copy = nullptr;
  CHECK(probe.alive.expired());  // the last copy gone: the sink is destroyed
}

TEST_CASE("EventGate::close drops every sink and later calls run nothing", "[http]") {
  auto gate = std::make_shared<EventGate>();
  Probe a, b;
  auto ca = gate->guard<int>(a.sink());
  auto cb = gate->guard<int>(b.sink());
  const std::weak_ptr<int> a_alive = a.alive, b_alive = b.alive;
  std::shared_ptr<int> a_calls = a.calls;
  a.calls.reset();
  b.calls.reset();
  ca(1);
  gate->close();
  CHECK(b_alive.expired());  // destroyed by close, though the engine still holds its callback
  ca(10);
  cb(10);
  CHECK(*a_calls == 1);  // the call after close ran nothing
  a_calls.reset();
  CHECK(a_alive.expired());
  auto late = gate->guard<int>(Probe().sink());  // guarded after close: never runs, holds nothing
  late(1);
  // Callbacks outliving the gate itself are harmless.
  gate.reset();
  ca(1);
  ca = nullptr;
  cb = nullptr;
}

TEST_CASE("EventGate: callbacks called and dropped on other threads while the gate closes", "[http]") {
  for (int round = 0; round < 20; ++round) {
    auto gate = std::make_shared<EventGate>();
    auto total = std::make_shared<std::atomic<int>>(0);
    std::vector<std::function<void(int)>> callbacks;
    for (int i = 0; i < 64; ++i)
      callbacks.push_back(gate->guard<int>([total](int v) { total->fetch_add(v); }));
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&callbacks, t] {
        for (int i = t; i < 64; i += 4) {
          for (int k = 0; k < 50; ++k) callbacks[i](1);
          callbacks[i] = nullptr;
        }
      });
    }
    gate->close();
    for (auto& th : threads) th.join();
    CHECK(*total <= 64 * 50);
    CHECK(total.use_count() == 1);  // every sink is gone: closed or dropped
  }
}
