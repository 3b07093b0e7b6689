// The executor's kernels timed through the Backend interface, as training launches them, into the
// measured tables of a megaplan-profile/1 file (profiles/README.md). What is timed comes from
// core's kernel lists (core/kernel_list.h) for GPT and Llama models of the widths, tensor-parallel
// shards and microbatch sizes plans produce: every GEMM in its training layout with its epilogue,
// in bf16 and in fp16 (Megatron's --fp16: the same calls with fp16 operands; skipped on a backend
// without them), causal flash attention forward and backward, multi-head and grouped, with and without dropout, and
// each memory-bound kernel class (LayerNorm and RMSNorm, residual add, copies, embedding, GELU's and SwiGLU's
// activations, the rotary embedding, cross entropy, the optimizer's norm, AdamW, refresh and fill) by size.
//
// Kernels are timed in training's order, not alone: each grid cell is one microbatch's forward and
// backward of a twelve-layer model (embedding, layers, head, and back), launched back to back as
// the executor launches them, long enough first that the GPU's power limiter settles where that mix
// of kernels holds the clock (a kernel timed alone runs at the clock its own power allows, which
// is not a step's: on an H100 training gpt2-124m and gpt-1.3b both sit at the 700 W limit once
// warm). Then repetitions each run the sequence twice: once between two marks, once with a mark
// (a CUDA event on the GPU) after every kernel; a kernel's time is its interval's median less the
// marks' own cost, the difference of the two runs spread over the marks. Nothing waits for the
// host between repetitions. Kernels of blocks a cell's forward and backward do not launch
// (zero-bubble's I and W copies, stage boundaries), the kernels of cells too large to hold at once,
// the attention grid (forward then backward) and the optimizer's kernels are sequences of their
// own. Each sequence rotates over copies of its buffers larger than the GPU's L2 together, so that
// operands come from HBM. A kernel met in several sequences gets the median of all its samples;
// the spread is (p90 - p10) / median over them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/kernel_list.h"
#include "core/measured_costs.h"
#include "executor/runtime/backend.h"
#include "executor/runtime/kernel_launch.h"

namespace megaplan::exec {

// Kernels launched in this order, as a microbatch of training launches them. An attention
// forward stands for itself only: its backward is listed where it runs.
struct ProfileSequence {
  std::vector<Kernel> kernels;
  EmbeddingTable table;  // what the embedding and cross entropy kernels index
  // Run back to back this long before timing (at least once): a cell of training's order long
  // enough that the GPU's power limiter settles where the cell's mix holds it, whatever ran
  // before; a kernel alone shorter.
  double warmup_seconds = 0.1;
};

struct ProfileGrid {
  std::vector<ProfileSequence> sequences;
  // Repetitions: as many as fit in about `target_seconds`, within these bounds.
  double target_seconds = 0.03;
  int min_repetitions = 3;
  int max_repetitions = 20;
};

// Quick: GPTs of 2048 and 8192 tokens, widths 768, 2048 and 4096, no tensor-parallel shards; a
// Llama of width 2048 over 4096 tokens; attention at 1024 and 4096 tokens with 1 and 4 query heads
// per key-value head; the optimizer at 4 Mi and 64 Mi parameters; under a minute on an H100.
// Full: GPTs of 1024 to 16384 tokens, widths 768 to 8192 (1280 and 1600 among them), tp 1, 2, 4 and 8; Llamas of widths
// 2048 and 4096 over 4096, 8192 and 16384 tokens, tp 1 and 2; attention at 1024 to 8192 tokens, 8 to 128 batch-heads at
// half-octave steps, with 1, 4 and 8 query heads per key-value head; the optimizer at 1 Mi to 1 Gi parameters; about
// five minutes on an H200.
ProfileGrid profile_grid(bool quick);

// One transformer layer's forward and backward, in training's order, of the GPT of width `hidden`
// the grid profiles over `tokens` tokens (a whole number of its sequences): the compute the
// collective profiler runs beside a collective.
std::vector<Kernel> layer_kernels(int64_t hidden, int64_t tokens);

// `progress(done, total)` after each sequence. Allocates each sequence's buffers and releases them.
MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress);

}  // namespace megaplan::exec
