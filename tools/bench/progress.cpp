#include "tools/bench/progress.h"

#include <cstdio>
#include <iostream>

#include <unistd.h>

namespace paged::bench {

ProgressBar::ProgressBar(std::ostream& out, bool is_terminal, std::string label, int total,
                         std::chrono::milliseconds min_interval)
    : out_(out),
      is_terminal_(is_terminal),
      label_(std::move(label)),
      total_(total),
      min_interval_(min_interval),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void ProgressBar::update(int done) {
  const auto now = std::chrono::steady_clock::now();
  if (done == drawn_) return;
  if (drawn_ < 0 || done >= total_ || now - last_draw_ >= min_interval_) draw(done, now);
}

void ProgressBar::draw(int done, std::chrono::steady_clock::time_point now) {
  drawn_ = done;
  last_draw_ = now;
  if (!is_terminal_) {
    out_ << label_ << ": " << done << "/" << total_ << std::endl;
    return;
  }
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(static_cast<int64_t>(kWidth) * done / total_);
  const double seconds = std::chrono::duration<double>(now - start_).count();
  char rate[48];
  std::snprintf(rate, sizeof rate, "%.1f/s", seconds > 0 ? done / seconds : 0.0);
  out_ << "\r" << label_ << " " << (100 * static_cast<int64_t>(done) / total_) << "% [" << std::string(filled, '#')
       << std::string(kWidth - filled, ' ') << "] " << done << "/" << total_ << " " << rate
       << (done >= total_ ? "\n" : "") << std::flush;
}

ProgressBar stderr_progress(std::string label, int total) {
  const bool terminal = isatty(STDERR_FILENO) == 1;
  return ProgressBar(std::cerr, terminal, std::move(label), total,
                     std::chrono::milliseconds(terminal ? 100 : 1000));
}

}  // namespace paged::bench
