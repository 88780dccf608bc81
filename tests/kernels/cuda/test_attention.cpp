// Paged-attention decode and prefill against cpu::paged_attention: block sizes 8/16/32, head dims 64/128, GQA
// groups 1/4/8 (and 3, 7, 12, 16), ragged lengths, shuffled block tables whose unused entries are -1,
// queries read from a fused QKV row, sliding windows (1, 32, 100, 700: inside one partition or tile, across
// several, beyond the context).
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/paged_batch.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("paged_attention_decode matches the CPU twin", "[gpu][attention]") {
  require_device();
  std::mt19937 rng(5);
  for (const Shape& shape : shapes()) {
    // Ragged contexts around block and partition edges, plus random ones.
    std::vector<int> ctx = {1, 7, 16, 17, 64, 65, 511, 512, 513};
    if (!quick_mode()) ctx.push_back(1100);
    std::uniform_int_distribution<int> len(1, quick_mode() ? 700 : 1500);
    for (int i = 0; i < 4; ++i) ctx.push_back(len(rng));
    std::shuffle(ctx.begin(), ctx.end(), rng);
    const std::vector<int> q_len(ctx.size(), 1);
    for (const float q_scale : {1.0f, 4.0f}) {  // 4: peaked softmax, where the partition merge matters most
      const PagedBatch batch(rng, shape, ctx, q_len, q_scale);
      const auto ref = batch.reference();
      DeviceBatch dev(batch);
      const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
      // 512: the default; 64: many partitions per sequence; a max_context_len above the real one: what a CUDA
      // graph captured for longer contexts replays with.
      // 2048 and 4096: whole sequences, one partition each.
      for (const auto& [partition, max_len] : {std::pair{512, max_ctx}, std::pair{64, max_ctx}, std::pair{512, 4000},
                                               std::pair{2048, max_ctx}, std::pair{4096, 4000}}) {
        INFO(describe(shape) << ", partition " << partition << ", max_context_len " << max_len << ", q scale "
                             << q_scale);
        const size_t ws_bytes = cuda::paged_attention_decode_workspace(batch.total_q, shape.heads, shape.head_dim,
                                                                       max_len, partition);
        DeviceArray<char> ws(ws_bytes);
        CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));  // NaN: unwritten shows
        CUDA_REQUIRE(cuda::paged_attention_decode(dev.args, max_len, partition, ws.get(), ws_bytes, nullptr));
        check_close(to_float(dev.out.download()), ref, "decode");
      }
    }
  }
}

TEST_CASE("paged_attention_prefill matches the CPU twin: prefill, cached prefix, chunks, decode rows",
          "[gpu][attention]") {
  require_device();
  std::mt19937 rng(6);
  for (const Shape& shape : shapes()) {
    // (context, queries): whole prompts, a cached prefix with a new chunk, single decode tokens, odd sizes, chunks
    // cut to kPrefillTwoTileRows rows (the kernel with one m-tile a warp); then the same with a longer chunk (two).
    const int group = shape.heads / shape.kv_heads, q_short = cuda::kPrefillTwoTileRows / group;
    std::vector<std::pair<int, int>> mixed;
    for (auto [c, q] : {std::pair{1, 1}, {5, 5}, {33, 33}, {100, 37}, {300, 1}, {64, 64}, {257, 200}, {18, 3},
                        {129, 128}, {40, 1}})
      mixed.push_back({c, std::min(q, q_short)});
    std::vector<std::pair<int, int>> with_long = mixed;
    with_long.push_back({q_short + 101, q_short + 40});
    for (auto seqs : {mixed, with_long}) {
      std::shuffle(seqs.begin(), seqs.end(), rng);
      std::vector<int> ctx, q_len;
      for (auto [c, q] : seqs) {
        ctx.push_back(c);
        q_len.push_back(q);
      }
      const PagedBatch batch(rng, shape, ctx, q_len, 2.0f);
      const auto ref = batch.reference();
      DeviceBatch dev(batch);
      const int max_q = *std::max_element(q_len.begin(), q_len.end());
      INFO(describe(shape) << ", longest chunk " << max_q);
      CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));
      CUDA_REQUIRE(cuda::paged_attention_prefill(dev.args, max_q, nullptr));
      check_close(to_float(dev.out.download()), ref, "prefill");
    }
  }
}

TEST_CASE("decode and prefill with a sliding window match the CPU twin", "[gpu][attention]") {
  require_device();
  std::mt19937 rng(8);
  for (const Shape& shape : {Shape{128, 16, 32, 8}, Shape{64, 8, 8, 2}, Shape{128, 32, 28, 4}})
    for (const int window : {1, 32, 100, 700}) {
      INFO(describe(shape) << ", window " << window);
      // Decode: contexts below, at and far beyond the window, over partitions of 64 (many skipped) and 512.
      const std::vector<int> ctx = {1, 31, 32, 33, 99, 100, 101, 640, 1500, 2049};
      const PagedBatch decode(rng, shape, ctx, std::vector<int>(ctx.size(), 1), 4.0f);
      const auto decode_ref = decode.reference(window);
      DeviceBatch dev(decode);
      dev.args.window = window;
      for (const int partition : {64, 512}) {
        const size_t ws_bytes = cuda::paged_attention_decode_workspace(decode.total_q, shape.heads, shape.head_dim,
                                                                       4096, partition);
        DeviceArray<char> ws(ws_bytes);
        CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));
        CUDA_REQUIRE(cuda::paged_attention_decode(dev.args, 4096, partition, ws.get(), ws_bytes, nullptr));
        check_close(to_float(dev.out.download()), decode_ref, "decode, partition " + std::to_string(partition));
      }
      // Prefill: whole prompts longer than the window, a chunk after a long cached prefix, decode rows.
      const std::vector<int> p_ctx = {300, 129, 1000, 40, 65}, p_q = {300, 128, 77, 1, 65};
      const PagedBatch prefill(rng, shape, p_ctx, p_q, 2.0f);
      DeviceBatch pdev(prefill);
      pdev.args.window = window;
      CUDA_REQUIRE(cudaMemset(pdev.out.get(), 0xff, pdev.out.size() * sizeof(bf16)));
      CUDA_REQUIRE(cuda::paged_attention_prefill(pdev.args, 300, nullptr));
      check_close(to_float(pdev.out.download()), prefill.reference(window), "prefill");
    }
}

TEST_CASE("decode_partition: a one-wave cluster, else whole sequences that fill the SMs, else a block per two SMs",
          "[attention]") {
  // 8 KV heads on 132 SMs, 16-token blocks.
  CHECK(cuda::decode_partition(1, 8, 1024, 132, 16, 0) == 128);   // 8 partitions, 64 blocks: a cluster (64 tokens: 16)
  CHECK(cuda::decode_partition(1, 8, 2048, 132, 16, 0) == 256);   // 8 x 256
  CHECK(cuda::decode_partition(4, 8, 1024, 132, 16, 0) == 256);   // 4 partitions x 32: 128 blocks
  CHECK(cuda::decode_partition(8, 8, 1024, 132, 16, 0) == 512);   // 2 partitions x 64
  CHECK(cuda::decode_partition(1, 8, 256, 132, 16, 0) == 64);     // 4 x 64, the smallest partition
  CHECK(cuda::decode_partition(8, 8, 2048, 132, 16, 0) == 512);   // no cluster fits (256 blocks); 512 gives >= 66
  CHECK(cuda::decode_partition(64, 8, 1024, 132, 16, 0) == 512);  // large batches: the longest partition
  CHECK(cuda::decode_partition(1, 8, 8192, 132, 16, 0) == 512);   // 16 partitions: no cluster; 128 blocks
  CHECK(cuda::decode_partition(1, 2, 16384, 132, 16, 0) == 256);  // 512 gives 64 blocks (< 66); 256 gives 128
  CHECK(cuda::decode_partition(1, 1, 8192, 132, 16, 0) == 64);    // halved down to the shortest partition
  CHECK(cuda::decode_partition(1, 8, 1024, 132, 128, 0) == 128);  // never shorter than a KV block
  CHECK(cuda::decode_partition(1, 8, 1024, 132, 256, 0) == 256);
  // Whole sequences, one partition each, where they give at least `whole_blocks_per_sm` blocks an SM.
  CHECK(cuda::decode_partition(160, 8, 2048, 132, 16, 4) == 2048);  // 1,280 blocks: 9.7 an SM
  CHECK(cuda::decode_partition(160, 8, 1024, 132, 16, 4) == 1024);
  CHECK(cuda::decode_partition(160, 8, 8192, 132, 16, 4) == 4096);  // at most kMaxDecodePartition: 2 partitions
  CHECK(cuda::decode_partition(160, 8, 2048, 132, 16, 10) == 512);  // too few blocks: the rule above
  CHECK(cuda::decode_partition(8, 8, 2048, 132, 16, 4) == 512);     // 64 blocks
  CHECK(cuda::decode_partition(64, 8, 512, 132, 16, 4) == 512);     // a context of one 512 partition as before
  CHECK(cuda::decode_partition(1, 8, 1024, 132, 16, 4) == 128);     // the one-wave cluster first
  // The runner's default threshold (kDecodeWholeBlocksPerSm): batch 66 and up with 8 KV heads on 132 SMs.
  CHECK(cuda::decode_partition(900, 8, 1024, 132, 16) == 1024);
  CHECK(cuda::decode_partition(66, 8, 2048, 132, 16) == 2048);
  CHECK(cuda::decode_partition(65, 8, 2048, 132, 16) == 512);
}

TEST_CASE("attention launchers name what they refuse", "[gpu][attention]") {
  require_device();
  cuda::PagedAttentionArgs a;
  a.num_heads = 8;
  a.num_kv_heads = 2;
  a.head_dim = 96;
  a.block_size = 16;
  a.num_seqs = 1;
  a.q_stride = 8 * 96;
  cudaError_t e = cuda::paged_attention_prefill(a, 1, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("head_dim 96") != std::string::npos);
  a.head_dim = 128;
  a.q_stride = 8 * 128;
  a.block_size = 12;
  e = cuda::paged_attention_decode(a, 100, 512, nullptr, 0, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("block_size 12") != std::string::npos);
  a.block_size = 16;
  a.num_heads = 64;  // group 32
  a.q_stride = 64 * 128;
  e = cuda::paged_attention_decode(a, 100, 512, nullptr, 0, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("at most 16") != std::string::npos);
}
