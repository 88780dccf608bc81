// What one decode step costs on the way to a worker and back, on the CPU, stage by stage: the head's WireEncoder,
// pack_step, CAF's binary serialisation of the PackedStep and of the PackedResult both ways (one string each),
// unpack_step, the worker's WireDecoder (which runs check_step), then the StepResult packed and unpacked. The step: N
// running sequences with a history of L tokens each (a prompt of L/2, the rest output), one token computed and one
// sampled each, their block tables growing. Prints microseconds per step for each stage (median of the steps timed)
// and the bytes each way.
//
// Usage: bench_wire [N=1000] [L=300] [steps=200]
#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <variant>
#include <vector>

#include "actors/messages.h"
#include "actors/step_wire.h"
#include "model/step_check.h"

namespace {

using namespace paged;
using Clock = std::chrono::steady_clock;

constexpr int kBlockSize = 16;
constexpr int kVocab = 32000;

struct Sequence {
  SamplingParams params;
  std::vector<TokenId> prompt, output, stop_ids{2};
  std::vector<int32_t> table;
};

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0.0 : xs[xs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int history = argc > 2 ? std::atoi(argv[2]) : 300;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 200;
  const int max_len = history + steps + kBlockSize;
  std::vector<Sequence> seqs(static_cast<size_t>(n));
  int32_t next_block = 0;
  for (int i = 0; i < n; ++i) {
    Sequence& s = seqs[static_cast<size_t>(i)];
    s.params.temperature = 0.8f;
    for (int t = 0; t < history / 2; ++t) s.prompt.push_back((i * 31 + t) % kVocab);
    for (int t = history / 2; t < history; ++t) s.output.push_back((i * 17 + t) % kVocab);
    for (int b = 0; b * kBlockSize < history + 1; ++b) s.table.push_back(next_block++);
  }
  const StepLimits limits{.vocab_size = kVocab, .block_size = kBlockSize,
                          .num_blocks = next_block + n * (steps / kBlockSize + 2), .num_swap_blocks = 0,
                          .max_model_len = max_len, .max_num_batched_tokens = n};
  WireEncoder encoder;
  WireDecoder decoder(limits);
  std::vector<double> t_encode, t_pack, t_caf, t_unpack, t_decode, t_result;
  size_t step_bytes = 0, result_bytes = 0;
  for (int step = 0; step < steps; ++step) {
    StepBatch batch;
    for (int i = 0; i < n; ++i) {
      Sequence& s = seqs[static_cast<size_t>(i)];
      const int pos = static_cast<int>(s.prompt.size() + s.output.size()) - 1;
      if ((pos + 1) / kBlockSize >= static_cast<int>(s.table.size())) s.table.push_back(next_block++);
      SeqChunk c;
      c.seq = static_cast<SeqId>(i + 1);
      c.tokens = {s.output.back()};
      c.start_pos = pos;
      c.block_table = s.table;
      c.samples.push_back({.params = &s.params, .seed = static_cast<uint64_t>(i), .prompt = &s.prompt,
                           .output = &s.output, .stop_ids = &s.stop_ids});
      batch.seqs.push_back(std::move(c));
    }
    // A CAF message's trip for `x`: serialised, deserialised into `back`.
    const auto through_caf = [](auto& x, auto& back) {
      std::vector<char> bytes;
      caf::binary_serializer sink(nullptr, bytes);
      if (sink(x)) return false;
      caf::binary_deserializer source(nullptr, bytes);
      return !source(back);
    };
    const auto t0 = Clock::now();
    const WireStep wire = encoder.encode(batch);
    const auto t1 = Clock::now();
    PackedStep packed{pack_step(wire)};
    const auto t2 = Clock::now();
    PackedStep received;
    if (!through_caf(packed, received)) return 1;
    const auto t3 = Clock::now();
    auto unpacked = unpack_step(received.bytes);
    const auto t4 = Clock::now();
    if (const auto* e = std::get_if<FieldError>(&unpacked)) {
      std::fprintf(stderr, "unpack: %s\n", e->describe().c_str());
      return 1;
    }
    auto decoded = decoder.decode(std::get<WireStep>(std::move(unpacked)));
    const auto t5 = Clock::now();
    if (const auto* e = std::get_if<FieldError>(&decoded)) {
      std::fprintf(stderr, "refused: %s\n", e->describe().c_str());
      return 1;
    }
    // The worker's answer: one sampled token per sequence.
    StepResult result;
    for (int i = 0; i < n; ++i) {
      result.seqs.push_back(static_cast<SeqId>(i + 1));
      result.samples.push_back({{SampledToken{(i + step) % kVocab, -0.5f, {}}}});
    }
    const auto t6 = Clock::now();
    PackedResult reply{pack_result(result)};
    const auto t7 = Clock::now();
    PackedResult reply_received;
    if (!through_caf(reply, reply_received)) return 1;
    const auto t8 = Clock::now();
    auto back = unpack_result(reply_received.bytes);
    const auto t9 = Clock::now();
    if (const auto* e = std::get_if<FieldError>(&back)) {
      std::fprintf(stderr, "unpack result: %s\n", e->describe().c_str());
      return 1;
    }
    const auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
    if (step >= steps / 10) {  // past a warm-up
      t_encode.push_back(us(t0, t1));
      t_pack.push_back(us(t1, t2));
      t_caf.push_back(us(t2, t3) + us(t7, t8));
      t_unpack.push_back(us(t3, t4));
      t_decode.push_back(us(t4, t5));
      t_result.push_back(us(t6, t7) + us(t8, t9));
    }
    step_bytes = packed.bytes.size();
    result_bytes = reply.bytes.size();
    const StepResult& answer = std::get<StepResult>(back);
    for (int i = 0; i < n; ++i) seqs[static_cast<size_t>(i)].output.push_back(answer.samples[i][0][0].token);
  }
  const double total = median(t_encode) + median(t_pack) + median(t_caf) + median(t_unpack) + median(t_decode) +
                       median(t_result);
  std::printf("bench_wire: %d sequences, history %d, %d steps (median us per step)\n", n, history, steps);
  std::printf("  encode %.0f | pack %.0f | CAF both ways %.0f | unpack %.0f | decode+check %.0f | result pack+unpack "
              "%.0f | total %.0f\n",
              median(t_encode), median(t_pack), median(t_caf), median(t_unpack), median(t_decode), median(t_result),
              total);
  std::printf("  bytes: step %zu (%.1f per sequence), result %zu\n", step_bytes, double(step_bytes) / n,
              result_bytes);
  return 0;
}
