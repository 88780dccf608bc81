// What one render of a template may spend, and the account of the render running on a thread. A template can come
// with a request (vLLM's per-request chat_template): its loops, its strings and its recursion must not hang the
// server or exhaust its memory, so every render is metered and fails with a TemplateError past a limit.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace paged::jinja {

struct Object;

/// The limits of one render. The defaults leave real chat templates (thousands of messages, tools) far below them.
struct RenderLimits {
  int64_t max_steps = 2'000'000;         // expressions evaluated, statements run, loop iterations, items visited
  size_t max_bytes = size_t{64} << 20;   // made over the render, not only alive: strings, list and dict entries,
                                         // the output
  int max_depth = 200;                   // expressions (macro calls within) evaluated inside each other, and lists
                                         // and dicts inside each other
  std::chrono::milliseconds max_time{2000};  // wall time (what a single large string operation costs between steps)
};

/// The account of the render open on this thread; construction opens it (restoring the one before, if any, when it
/// closes), destruction closes it. Not thread-safe: it belongs to its thread.
class RenderBudget {
 public:
  explicit RenderBudget(const RenderLimits& limits = {});
  /// Empties every namespace the render made, so that namespaces holding each other (a cycle) are freed too.
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  /// The account open on this thread, or nullptr outside a render.
  static RenderBudget* current();
  const RenderLimits& limits() const { return limits_; }
  /// Throws TemplateError past max_steps or max_time.
  void steps(int64_t n);
  /// Throws TemplateError past max_bytes.
  void bytes(size_t n);
  /// A namespace made by the render, to be emptied when it closes.
  void keep(const std::shared_ptr<Object>& ns) { namespaces_.push_back(ns); }

 private:
  RenderLimits limits_;
  int64_t steps_ = 0;
  size_t bytes_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<std::shared_ptr<Object>> namespaces_;
  RenderBudget* previous_;
};

/// Charges the render open on this thread, if any (nothing outside a render); throw as RenderBudget::steps / bytes.
void charge_steps(int64_t n);
void charge_bytes(size_t n);

/// The depth of lists and dicts a value may reach: the open render's max_depth, else RenderLimits' default.
int max_value_depth();

}  // namespace paged::jinja
