// Dropout masks drawn from a counter-based generator (Philox4x32-10, from Random123), one
// definition for the CPU reference and the CUDA kernels. Whether an element is kept depends only on
// the run's seed, the tensor (the layer and the kind of dropout), the global sample and the
// element's place in that sample's tensor of the whole model — never on the layout — so every
// tp/sp/pp/dp layout draws the single rank's masks, and a recomputed forward or a backward draws
// the forward's again without storing them.
//
// An element is kept with probability 1 - p and then scaled by 1 / (1 - p) (Megatron's inverted
// dropout); p = 0 keeps everything unscaled.
#pragma once

#include <Random123/philox.h>

#include <cstdint>

#include "executor/host_device.h"
#include "executor/kernels/token_places.h"

namespace megaplan::exec {

// What a dropout is applied to in the GPT (Megatron's three: the embedding's output, each
// branch's output before the residual add (--hidden-dropout), attention's probabilities
// (--attention-dropout)).
enum class DropoutKind : uint32_t { kEmbedding, kAttentionBranch, kMlpBranch, kAttentionProbabilities };

// The tensor's number: layer (of the whole model, from 0) and kind. Below 2^16 (a model of at most
// 16383 layers).
MEGAPLAN_HOST_DEVICE inline uint32_t dropout_site(int64_t layer, DropoutKind kind) {
  return static_cast<uint32_t>(layer) * 4u + static_cast<uint32_t>(kind);
}

// One tensor's mask in one microbatch, and where this rank's part of it lies in the whole.
struct DropoutMask {
  float probability = 0;  // p in [0, 1)
  uint64_t seed = 0;      // --seed
  uint32_t site = 0;      // dropout_site(...)
  int64_t first_sample =
      0;            // the global sample (position in the run's sample order) of the microbatch's first sequence
  int64_t seq = 0;  // tokens per sequence, the whole sequence's
  // Where the rank's tokens of a sequence lie in it (context parallelism holds two chunks).
  TokenPlaces places = {};
  // A token-major tensor [rows x cols] of the microbatch's tokens (batch x the rank's tokens of each
  // sequence): this rank's first row among them (sequence parallelism holds a slice of the rows).
  int64_t first_row = 0;
  // Attention's probabilities [batch x heads x seq x seq]: this rank's first head of the model's
  // (tensor parallelism holds a slice of the heads).
  int64_t first_head = 0;

  MEGAPLAN_HOST_DEVICE bool active() const { return probability > 0; }
  MEGAPLAN_HOST_DEVICE float scale() const { return 1.0f / (1.0f - probability); }
  // Elements whose 32-bit draw is below it are dropped.
  MEGAPLAN_HOST_DEVICE uint32_t threshold() const {
    return static_cast<uint32_t>(static_cast<double>(probability) * 4294967296.0);
  }

  // Whether element `element` of global sample `sample`'s tensor is kept. Four neighbouring
  // elements share one Philox draw (its four words).
  MEGAPLAN_HOST_DEVICE bool keeps(int64_t sample, uint64_t element) const {
    const uint64_t block = element >> 2;
    const auto s = static_cast<uint64_t>(sample);
    const r123::Philox4x32::ctr_type counter = {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                                 static_cast<uint32_t>(s),
                                                 site | static_cast<uint32_t>(s >> 32) << 16}};
    const r123::Philox4x32::key_type key = {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
    const r123::Philox4x32::ctr_type draw = r123::Philox4x32()(counter, key);
    return draw.v[element & 3] >= threshold();
  }
  // Row `row` of this rank's token-major rows, column `col` of `cols`: its global sample and its
  // element in that sample's tensor [seq x cols].
  struct TokenElement {
    int64_t sample;
    uint64_t element;
  };
  MEGAPLAN_HOST_DEVICE TokenElement token_element(int64_t row, int64_t col, int64_t cols) const {
    const int64_t global = first_row + row, local = places.local_length(seq);
    return {first_sample + global / local, static_cast<uint64_t>(places.place(global % local) * cols + col)};
  }
  MEGAPLAN_HOST_DEVICE bool keeps_token(int64_t row, int64_t col, int64_t cols) const {
    const TokenElement at = token_element(row, col, cols);
    return keeps(at.sample, at.element);
  }
  // Sequence `batch`, this rank's head `head`, query `query`, key `key`.
  MEGAPLAN_HOST_DEVICE bool keeps_probability(int64_t batch, int64_t head, int64_t query, int64_t key_token) const {
    return keeps(first_sample + batch, static_cast<uint64_t>(((first_head + head) * seq + query) * seq + key_token));
  }
};

}  // namespace megaplan::exec
