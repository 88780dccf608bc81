// CudaModelRunner's sampling and prompt scoring: see cuda_runner.h and runner_impl.h.
#include "kernels/cuda/runner_impl.h"

#include "kernels/cuda/penalty_rows.h"
#include "kernels/cuda/token_bitmask.h"

namespace paged {

namespace {

// Whether the GPU reproduces sample_logits for this spec: no beam candidates, and logits processing or a token mask
// only for a spec alone on its logits row (they change the row in place: apply_penalties, the twin of
// apply_penalty_ops; apply_token_bitmask, the twin of apply_token_mask). Logprob alternatives (num_logprobs) are scored on the GPU after sampling (score_tokens, the
// twin of score_token).
bool gpu_samplable(const SampleSpec& spec, bool alone_on_row) {
  const SamplingParams& p = *spec.params;
  const bool masks_stops =
      spec.stop_ids && !spec.stop_ids->empty() && static_cast<int>(generated_count(spec)) < p.min_tokens;
  const bool processed = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
                         !p.logit_bias.empty() || masks_stops || !p.bad_words_token_ids.empty();
  // Structured outputs, allowed_token_ids: cuda::apply_token_bitmask
  const bool masked = spec.mask_source != nullptr || !p.allowed_token_ids.empty();
  return spec.num_logprobs <= kMaxLogprobs && spec.num_candidates <= 1 && (!(processed || masked) || alone_on_row);
}

}  // namespace

StepResult CudaModelRunner::Impl::sample(const StepBatch& batch, const Plan& plan) {
  PAGED_CUDA_CHECK(cudaEventRecord(step_end, compute));  // the forward pass ends here; sampling moves it on
  // Every sample spec is one row: GPU rows in batches of max_seqs, the rest on the CPU from downloaded logits.
  using Job = SampleJob;
  std::vector<Job> gpu_jobs, cpu_jobs;
  for (int s = 0; s < static_cast<int>(batch.seqs.size()); ++s) {
    const SeqChunk& c = batch.seqs[s];
    for (int k = 0; k < static_cast<int>(samples_answered(c)); ++k) {
      // With drafts, sample k has its own row (position k); the specs of n > 1 share the last token's.
      Job j{s, k, plan.logits_row[s] + (c.num_drafts > 0 ? k : 0), chunk_sample(c, k).spec};
      (gpu_samplable(j.spec, c.num_drafts > 0 || c.samples.size() == 1) ? gpu_jobs : cpu_jobs).push_back(j);
    }
  }

  StepResult result;
  std::vector<int> chunk_slot(batch.seqs.size(), -1);
  for (int s = 0; s < static_cast<int>(batch.seqs.size()); ++s) {
    if (batch.seqs[s].samples.empty()) continue;
    chunk_slot[s] = static_cast<int>(result.seqs.size());
    result.seqs.push_back(batch.seqs[s].seq);
    result.samples.emplace_back(samples_answered(batch.seqs[s]));
  }
  apply_penalties(gpu_jobs);
  apply_token_masks(gpu_jobs);  // after the penalties, as sample_logits
  for (size_t begin = 0; begin < gpu_jobs.size(); begin += max_seqs) {
    const int rows = static_cast<int>(std::min<size_t>(max_seqs, gpu_jobs.size() - begin));
    for (int r = 0; r < rows; ++r) {
      const Job& j = gpu_jobs[begin + r];
      const SampleSpec& spec = j.spec;
      cuda::SamplingRow& row = sample_rows.host[r];
      row.temperature = spec.params->temperature;
      row.top_k = spec.params->top_k;
      row.top_p = spec.params->top_p;
      row.min_p = spec.params->min_p;
      row.seed = spec.seed;
      row.index = generated_count(spec);
      logits_row_ids.host[r] = j.logits_row;
    }
    PAGED_CUDA_CHECK(sample_rows.upload(rows, compute));
    PAGED_CUDA_CHECK(logits_row_ids.upload(rows, compute));
    PAGED_CUDA_CHECK(cuda::sample_tokens(sampled.device.get(), logprobs.device.get(), logits.get(),
                                         logits_row_ids.device.get(), sample_rows.device.get(), rows, vocab,
                                         sample_ws.get(), cuda::sampling_workspace_bytes(max_seqs, vocab), compute));
    PAGED_CUDA_CHECK(sampled.download(rows, compute));
    PAGED_CUDA_CHECK(logprobs.download(rows, compute));
    PAGED_CUDA_CHECK(cudaEventRecord(step_end, compute));
    PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));  // the staging is reused by the next batch of rows
    for (int r = 0; r < rows; ++r) {
      const Job& j = gpu_jobs[begin + r];
      result.samples[chunk_slot[j.chunk]][j.sample] = {SampledToken{sampled.host[r], logprobs.host[r], {}}};
    }
  }
  // The GPU rows that ask alternatives: their logits rows scored with the sampled tokens as targets, in passes over
  // the step's logits rows in which each row is scored for one sample (n > 1 samples of a chunk share its row).
  std::vector<Job> scored;
  for (const Job& j : gpu_jobs)
    if (j.spec.num_logprobs > 0) scored.push_back(j);
  if (!scored.empty()) allocate_score_staging();
  while (!scored.empty()) {
    std::vector<Job> pass, later;
    std::vector<char> taken(plan.logits_rows, 0);
    int num_top = 0;
    std::fill(score_targets.host.get(), score_targets.host.get() + plan.logits_rows, 0);
    for (const Job& j : scored) {
      if (std::exchange(taken[j.logits_row], 1)) {
        later.push_back(j);
        continue;
      }
      pass.push_back(j);
      score_targets.host[j.logits_row] = result.samples[chunk_slot[j.chunk]][j.sample][0].token;
      num_top = std::max(num_top, j.spec.num_logprobs);
    }
    PAGED_CUDA_CHECK(score_targets.upload(plan.logits_rows, compute));
    PAGED_CUDA_CHECK(cuda::score_tokens(score_logprobs.device.get(), score_ranks.device.get(),
                                        score_top_ids.device.get(), score_top_logprobs.device.get(), logits.get(),
                                        score_targets.device.get(), plan.logits_rows, vocab, num_top, compute));
    PAGED_CUDA_CHECK(score_logprobs.download(plan.logits_rows, compute));
    PAGED_CUDA_CHECK(score_top_ids.download(size_t(plan.logits_rows) * num_top, compute));
    PAGED_CUDA_CHECK(score_top_logprobs.download(size_t(plan.logits_rows) * num_top, compute));
    PAGED_CUDA_CHECK(cudaEventRecord(step_end, compute));
    PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));
    for (const Job& j : pass) {
      SampledToken& t = result.samples[chunk_slot[j.chunk]][j.sample][0];
      const int64_t at = int64_t{j.logits_row} * num_top;
      t.logprob = score_logprobs.host[j.logits_row];
      for (int k = 0; k < j.spec.num_logprobs; ++k)
        t.top_logprobs.emplace_back(score_top_ids.host[at + k], score_top_logprobs.host[at + k]);
    }
    scored = std::move(later);
  }
  if (!cpu_jobs.empty()) {
    if (!h_logits) h_logits = pinned_alloc<float>(int64_t{max_rows} * vocab);
    // Only the rows sampled here come down (a few requests with logprobs in a batch of hundreds are a few rows of
    // vocab floats each, not all of them), each to its place; all at once when they are most of the rows.
    const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
    if (2 * cpu_jobs.size() >= static_cast<size_t>(plan.logits_rows)) {
      PAGED_CUDA_CHECK(cudaMemcpyAsync(h_logits.get(), logits.get(), plan.logits_rows * row_bytes,
                                       cudaMemcpyDeviceToHost, compute));
    } else {
      for (const Job& j : cpu_jobs)
        PAGED_CUDA_CHECK(cudaMemcpyAsync(h_logits.get() + int64_t{j.logits_row} * vocab,
                                         logits.get() + int64_t{j.logits_row} * vocab, row_bytes,
                                         cudaMemcpyDeviceToHost, compute));
    }
    PAGED_CUDA_CHECK(cudaEventRecord(step_end, compute));
    PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));
    std::vector<float> row(vocab);
    for (const Job& j : cpu_jobs) {
      const float* src = h_logits.get() + int64_t{j.logits_row} * vocab;
      std::copy(src, src + vocab, row.begin());
      result.samples[chunk_slot[j.chunk]][j.sample] = sample_logits(row, j.spec);
    }
  }
  return result;
}

void CudaModelRunner::Impl::apply_penalties(const std::vector<SampleJob>& jobs) {
  std::vector<cuda::PenaltyRow> rows;
  std::vector<int32_t> ids;
  std::vector<float> values;
  for (const SampleJob& j : jobs)
    if (const PenaltyOps ops = penalty_ops(j.spec, vocab); !ops.empty())
      cuda::append_penalty_row(ops, j.logits_row, rows, ids, values);
  if (rows.empty()) return;
  if (!penalty_rows.device) penalty_rows.allocate(max_rows);
  if (ids.size() > penalty_capacity) {
    PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));  // the old staging may still be in flight
    penalty_capacity = std::max(ids.size(), size_t{4096});
    penalty_ids.allocate(penalty_capacity);
    penalty_values.allocate(penalty_capacity);
  }
  std::copy(rows.begin(), rows.end(), penalty_rows.host.get());
  std::copy(ids.begin(), ids.end(), penalty_ids.host.get());
  std::copy(values.begin(), values.end(), penalty_values.host.get());
  PAGED_CUDA_CHECK(penalty_rows.upload(rows.size(), compute));
  PAGED_CUDA_CHECK(penalty_ids.upload(ids.size(), compute));
  PAGED_CUDA_CHECK(penalty_values.upload(values.size(), compute));
  PAGED_CUDA_CHECK(cuda::apply_penalties(logits.get(), penalty_rows.device.get(), penalty_ids.device.get(),
                                         penalty_values.device.get(), static_cast<int>(rows.size()), vocab, compute));
}

void CudaModelRunner::Impl::apply_token_masks(const std::vector<SampleJob>& jobs) {
  const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
  int n = 0;
  for (const SampleJob& j : jobs) {
    const SampleSpec& spec = j.spec;
    if (!spec.mask_source && spec.params->allowed_token_ids.empty()) continue;
    if (!mask_rows.device) {
      mask_rows.allocate(max_rows);
      mask_bits.allocate(static_cast<size_t>(max_rows) * words);
    }
    mask_rows.host[n] = j.logits_row;
    // On the host while the GPU still computes the forward pass (nothing since it was launched waited for it).
    fill_token_mask(spec, std::span<uint32_t>(mask_bits.host.get() + static_cast<size_t>(n) * words, words));
    ++n;  // at most max_rows: each masked job is alone on its row
  }
  if (n == 0) return;
  PAGED_CUDA_CHECK(mask_rows.upload(n, compute));
  PAGED_CUDA_CHECK(mask_bits.upload(static_cast<size_t>(n) * words, compute));
  PAGED_CUDA_CHECK(cuda::apply_token_bitmask(logits.get(), mask_rows.device.get(), mask_bits.device.get(), n, vocab,
                                             compute));
}

void CudaModelRunner::Impl::allocate_score_staging() {
  if (score_rows.device) return;
  score_rows.allocate(max_rows);
  score_targets.allocate(max_rows);
  score_ranks.allocate(max_rows);
  score_logprobs.allocate(max_rows);
  score_top_ids.allocate(int64_t{max_rows} * kMaxLogprobs);
  score_top_logprobs.allocate(int64_t{max_rows} * kMaxLogprobs);
}

void CudaModelRunner::Impl::score_prompts(const StepBatch& batch, StepResult& result) {
  struct Row {
    size_t entry;     // of result.prompt_logprobs
    int32_t hidden;   // row of `normed`
    TokenId target;
    int num_top;      // the chunk's
  };
  std::vector<Row> rows;
  int32_t first = 0;  // the row of `normed` of the chunk's first token (decode steps: row s is sequence s)
  int num_top = 0;
  for (const SeqChunk& c : batch.seqs) {
    const PromptLogprobsSpec& want = c.prompt_logprobs;
    if (want.count > 0) {
      const size_t entry = result.prompt_logprobs.size();
      result.prompt_logprobs.push_back({c.seq, c.start_pos + 1, std::vector<PromptLogprob>(want.count)});
      for (int i = 0; i < want.count; ++i)
        rows.push_back({entry, first + i,
                        static_cast<size_t>(i) + 1 < c.tokens.size() ? c.tokens[i + 1] : want.next_token,
                        want.num_top});
      num_top = std::max(num_top, want.num_top);
    }
    first += static_cast<int32_t>(c.tokens.size());
  }
  if (rows.empty()) return;
  allocate_score_staging();
  std::vector<size_t> filled(result.prompt_logprobs.size(), 0);
  for (size_t begin = 0; begin < rows.size(); begin += max_seqs) {
    const int n = static_cast<int>(std::min<size_t>(max_seqs, rows.size() - begin));
    for (int r = 0; r < n; ++r) {
      score_rows.host[r] = rows[begin + r].hidden;
      score_targets.host[r] = rows[begin + r].target;
    }
    PAGED_CUDA_CHECK(score_rows.upload(n, compute));
    PAGED_CUDA_CHECK(score_targets.upload(n, compute));
    PAGED_CUDA_CHECK(cuda::gather_rows(last_hidden.get(), normed.get(), score_rows.device.get(), n, hidden,
                                       max_tokens, 1.0f, compute));
    lm_head_logits(last_hidden.get(), n);
    PAGED_CUDA_CHECK(cuda::score_tokens(score_logprobs.device.get(), score_ranks.device.get(),
                                        score_top_ids.device.get(), score_top_logprobs.device.get(), logits.get(),
                                        score_targets.device.get(), n, vocab, num_top, compute));
    PAGED_CUDA_CHECK(score_logprobs.download(n, compute));
    PAGED_CUDA_CHECK(score_ranks.download(n, compute));
    PAGED_CUDA_CHECK(score_top_ids.download(size_t(n) * num_top, compute));
    PAGED_CUDA_CHECK(score_top_logprobs.download(size_t(n) * num_top, compute));
    PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));  // the staging is reused by the next pass
    for (int r = 0; r < n; ++r) {
      const Row& row = rows[begin + r];
      ChunkPromptLogprobs& chunk = result.prompt_logprobs[row.entry];
      PromptLogprob& t = chunk.tokens[filled[row.entry]++];
      t.token = row.target;
      t.logprob = score_logprobs.host[r];
      t.rank = score_ranks.host[r];
      for (int j = 0; j < std::min(row.num_top, vocab); ++j)
        t.top_logprobs.emplace_back(score_top_ids.host[int64_t{r} * num_top + j],
                                    score_top_logprobs.host[int64_t{r} * num_top + j]);
    }
  }
}

}  // namespace paged
