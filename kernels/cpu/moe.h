// CPU reference operators of a mixture-of-experts MLP (Mixtral, Qwen3-MoE), float32: the grouped expert products
// over slots sorted by expert, the weighted combination back into token order, and the whole MLP built from them
// and the routing of model/moe/expert_routing.h. The twins of the CUDA kernels of kernels/cuda/moe.h.
#pragma once

#include <cstdint>

namespace paged::cpu {

/// out[p] = x[x_rows ? x_rows[p] : p] * w[e]^T for every sorted position p of expert e (p in
/// [offsets[e], offsets[e+1])): one product per expert over its rows, the experts' weights back to back.
void grouped_linear(float* out,              // [offsets[num_experts]][n]
                    const float* x,          // [rows][k]: the rows x_rows indexes, or the sorted rows themselves
                    const int32_t* x_rows,   // [offsets[num_experts]] or nullptr
                    const int32_t* offsets,  // [num_experts + 1]
                    const float* w,          // [num_experts][n][k]
                    int num_experts, int n, int k);

/// out[t] (+)= sum over j < top_k of weights[t * top_k + j] * y[slot_position[t * top_k + j]]: the experts' outputs
/// back in token order, weighted by the router; added to out when accumulate, else stored.
void combine_experts(float* out,                    // [tokens][hidden]
                     const float* y,                // [tokens * top_k][hidden], sorted by expert
                     const int32_t* slot_position,  // [tokens * top_k]
                     const float* weights,          // [tokens * top_k]
                     int tokens, int top_k, int hidden, bool accumulate);

/// The weights of one rank's mixture-of-experts MLP (each expert's rank slice of inter columns).
struct MoeWeights {
  const float* router;   // [num_experts][hidden], replicated
  const float* gate_up;  // [num_experts][2 * inter][hidden]: each expert's gate rows, then its up rows
  const float* down;     // [num_experts][hidden][inter]
  int num_experts, top_k, inter;
  bool renormalize;
};

/// out = the MLP of x: route_tokens over x * router^T, group_by_expert, grouped gate/up, SiLU-and-mul, grouped down,
/// combine_experts (stored). Under tensor parallelism every rank routes alike and out is its partial sum.
void moe_mlp(float* out,      // [tokens][hidden]
             const float* x,  // [tokens][hidden]
             int tokens, int hidden, const MoeWeights& w);

}  // namespace paged::cpu
