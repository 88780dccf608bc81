#include "model/scheduling/step_profile.h"

#include <cstdio>

namespace paged {

StepKind step_kind(const StepBatch& batch) {
  bool single = false, longer = false;
  for (const SeqChunk& c : batch.seqs) (c.tokens.size() == 1 ? single : longer) = true;
  return longer ? (single ? StepKind::mixed : StepKind::prefill) : StepKind::decode;
}

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::decode: return "decode";
    case StepKind::mixed: return "mixed";
    case StepKind::prefill: return "prefill";
  }
  return "?";
}

void StepProfile::add(StepKind kind, int64_t tokens, int64_t wall_us, const StepCost& cost) {
  std::lock_guard lock(mu_);
  Row& r = rows_[static_cast<size_t>(kind)];
  ++r.steps;
  r.tokens += tokens;
  r.wall_us += wall_us;
  r.busy_us += cost.busy_us;
  r.idle_before_us += cost.idle_before_us;
}

StepProfile::Row StepProfile::row(StepKind kind) const {
  std::lock_guard lock(mu_);
  return rows_[static_cast<size_t>(kind)];
}

std::string StepProfile::table() const {
  std::array<Row, 3> rows;
  {
    std::lock_guard lock(mu_);
    rows = rows_;
  }
  Row total;
  std::string out = "kind       steps  tokens/step   wall ms   busy ms   host ms   idle ms   busy %\n";
  const auto line = [&](const char* name, const Row& r) {
    const double n = static_cast<double>(r.steps);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-8s %7lld %12.1f %9.3f %9.3f %9.3f %9.3f %8.1f\n", name,
                  static_cast<long long>(r.steps), double(r.tokens) / n, double(r.wall_us) / n / 1e3,
                  double(r.busy_us) / n / 1e3, double(r.wall_us - r.busy_us) / n / 1e3,
                  double(r.idle_before_us) / n / 1e3, r.wall_us ? 100.0 * double(r.busy_us) / double(r.wall_us) : 0.0);
    out += buf;
  };
  for (StepKind kind : {StepKind::decode, StepKind::mixed, StepKind::prefill}) {
    const Row& r = rows[static_cast<size_t>(kind)];
    if (r.steps == 0) continue;
    line(step_kind_name(kind), r);
    total.steps += r.steps;
    total.tokens += r.tokens;
    total.wall_us += r.wall_us;
    total.busy_us += r.busy_us;
    total.idle_before_us += r.idle_before_us;
  }
  if (total.steps) line("all", total);
  return out;
}

}  // namespace paged
