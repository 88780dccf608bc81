#include "model/template/jinja/budget.h"

#include <string>

#include "model/template/jinja/error.h"
#include "model/template/jinja/value.h"

namespace paged::jinja {
namespace {

thread_local RenderBudget* open_budget = nullptr;

// How many steps go between two looks at the clock.
constexpr int64_t kClockEvery = 1024;

}  // namespace

RenderBudget::RenderBudget(const RenderLimits& limits)
    : limits_(limits), deadline_(std::chrono::steady_clock::now() + limits.max_time), previous_(open_budget) {
  open_budget = this;
}

RenderBudget::~RenderBudget() {
  // Held here, a namespace outlives the emptying of every other: none is destroyed inside another's entries.
  for (const auto& ns : namespaces_) ns->entries.clear();
  open_budget = previous_;
}

RenderBudget* RenderBudget::current() { return open_budget; }

void RenderBudget::steps(int64_t n) {
  const int64_t before = steps_;
  steps_ += n;
  if (steps_ > limits_.max_steps)
    fail("the template takes more than " + std::to_string(limits_.max_steps) + " steps to render");
  if (before / kClockEvery != steps_ / kClockEvery && std::chrono::steady_clock::now() > deadline_)
    fail("the template takes more than " + std::to_string(limits_.max_time.count()) + " ms to render");
}

void RenderBudget::bytes(size_t n) {
  bytes_ += n;
  if (bytes_ > limits_.max_bytes)
    fail("the template makes more than " + std::to_string(limits_.max_bytes >> 20) + " MiB of text and lists");
}

void charge_steps(int64_t n) {
  if (open_budget) open_budget->steps(n);
}

void charge_bytes(size_t n) {
  if (open_budget) open_budget->bytes(n);
}

int max_value_depth() { return open_budget ? open_budget->limits().max_depth : RenderLimits{}.max_depth; }

}  // namespace paged::jinja
