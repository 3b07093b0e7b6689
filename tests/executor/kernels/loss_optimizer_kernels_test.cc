// The loss and optimizer kernels against the CPU references and double-precision math on fresh
// random inputs, in bf16 and in fp16: the fused softmax cross entropy (padded vocabularies, masks, a
// vocabulary shard with targets outside it, in place), the multi-tensor AdamW with its 16-bit
// weight copy, and the deterministic device sums.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/implementation_options.h"
#include "executor/kernels/cuda/adamw.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/reductions.h"
#include "executor/kernels/cuda/stream.h"
#include "executor/kernels/reference/adamw.h"
#include "executor/kernels/reference/cross_entropy.h"
#include "tests/executor/kernels/relative_error.h"

namespace cu = megaplan::exec::cuda;
namespace ref = megaplan::exec::reference;

namespace {

using megaplan::DType;
using megaplan::test::relative_error;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::vector<double> widen(const std::vector<float>& values) { return {values.begin(), values.end()}; }

std::vector<float> normal_values(std::size_t n, float mean, float deviation, std::mt19937& generator) {
  std::normal_distribution<float> normal(mean, deviation);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

// int32 targets travel as their bits in a float buffer: the helpers move floats only.
int32_t* upload_targets(const std::vector<int32_t>& targets, cudaStream_t stream) {
  std::vector<float> bits(targets.size());
  std::memcpy(bits.data(), targets.data(), targets.size() * sizeof(int32_t));
  return reinterpret_cast<int32_t*>(cu::upload_floats(bits, stream));
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("cross entropy statistics and backward match the CPU reference on padded vocabularies with masks",
          "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  // The gradients' rounding: up to 2^-8 relative in bf16, 2^-11 in fp16.
  const double tolerance = precision == DType::kFloat16 ? 2e-3 : 1e-2;
  // fp16 training scales the loss (Megatron's loss scaler) so that small gradients stay clear of
  // fp16's subnormals: unscaled, a 50k vocabulary's gradients of ~1e-8 would round to multiples
  // of 2^-24.
  const float loss_scale = precision == DType::kFloat16 ? 1024.0f : 1.0f;
  std::mt19937 generator(41);
  const cu::Stream stream;
  // (vocab, row_stride): GPT-2's vocabulary padded as Megatron pads it; a small one padded; an
  // odd stride that takes the scalar path.
  for (auto [vocab, stride] : {std::pair<int64_t, int64_t>{50257, 50304}, {1000, 1024}, {997, 1001}}) {
    for (int64_t tokens : {int64_t{1}, int64_t{37}, int64_t{512}}) {
      // The whole vocabulary, and the second of two vocabulary-parallel shards: about half the
      // targets fall in the other shard and reach the kernels as -1.
      for (bool sharded : {false, true}) {
        const int64_t vocab_start = sharded ? vocab : 0;
        INFO("vocab " << vocab << ", row_stride " << stride << ", tokens " << tokens << ", vocab_start "
                      << vocab_start);
        const auto t_count = static_cast<std::size_t>(tokens), v_count = static_cast<std::size_t>(vocab),
                   s_count = static_cast<std::size_t>(stride);
        // Logits rounded to 16 bits first, so the references see exactly what the device reads;
        // padded columns hold huge values (infinity in fp16) that would swamp the log-sum-exp if
        // they were read.
        std::vector<float> dense = normal_values(t_count * v_count, 0.0f, 3.0f, generator);
        for (float& value : dense) value = cu::from_half(cu::to_half(value, precision), precision);
        std::vector<float> padded(t_count * s_count, 1e30f);
        for (std::size_t t = 0; t < t_count; ++t) std::copy_n(&dense[t * v_count], v_count, &padded[t * s_count]);
        std::uniform_int_distribution<int64_t> pick(0, vocab_start + vocab - 1);
        std::bernoulli_distribution keep(0.7);
        std::vector<int64_t> targets64(t_count);
        std::vector<int32_t> columns(t_count);  // what the backend uploads: the shard's column or -1
        std::vector<float> mask(t_count);
        for (std::size_t t = 0; t < t_count; ++t) {
          targets64[t] = pick(generator);
          columns[t] = targets64[t] >= vocab_start ? static_cast<int32_t>(targets64[t] - vocab_start) : -1;
          mask[t] = (t == 0 || keep(generator)) ? 1.0f : 0.0f;  // at least one token counts
        }
        std::vector<float> want_lse(t_count), want_target(t_count);
        ref::cross_entropy_statistics(dense.data(), targets64.data(), t_count, v_count,
                                      static_cast<std::size_t>(vocab_start), want_lse.data(), want_target.data());

        cu::Half* logits = cu::upload_half(padded, precision, stream);
        int32_t* device_targets = upload_targets(columns, stream);
        float* device_mask = cu::upload_floats(mask, stream);
        // The outputs, poisoned.
        float* lse = cu::upload_floats(std::vector<float>(t_count, kNan), stream);
        float* target_logit = cu::upload_floats(std::vector<float>(t_count, kNan), stream);
        cu::Half* dlogits = cu::upload_half(std::vector<float>(t_count * s_count, 1e30f), precision, stream);

        cu::cross_entropy_statistics(logits, tokens, vocab, stride, device_targets, lse, target_logit, nullptr,
                                     precision, stream);
        const std::vector<float> got_lse = cu::download_floats(lse, t_count, stream);
        const double lse_error = relative_error(got_lse, widen(want_lse));
        CAPTURE(lse_error);
        CHECK(lse_error < 1e-6);
        CHECK(bitwise_equal(cu::download_floats(target_logit, t_count, stream), want_target));  // a logit, or 0

        // The backward takes the whole vocabulary's lse: for the shard, as if the other shard's
        // logits summed to as much as this one's.
        std::vector<float> whole_lse = got_lse;
        if (sharded) {
          for (float& value : whole_lse) value += static_cast<float>(std::log(2.0));
        }
        float* device_whole_lse = cu::upload_floats(whole_lse, stream);
        std::vector<float> want_dlogits(t_count * v_count);
        ref::cross_entropy_backward(dense.data(), whole_lse.data(), targets64.data(), mask.data(), t_count, v_count,
                                    static_cast<std::size_t>(vocab_start), loss_scale, want_dlogits.data());
        const float scale = loss_scale;  // the mask is each token's weight

        cu::cross_entropy_backward(logits, tokens, vocab, stride, device_targets, device_mask, device_whole_lse, scale,
                                   dlogits, precision, stream);
        const std::vector<float> got_padded = cu::download_half(dlogits, t_count * s_count, precision, stream);
        std::vector<float> got_dense(t_count * v_count);
        bool padding_zero = true;
        for (std::size_t t = 0; t < t_count; ++t) {
          std::copy_n(&got_padded[t * s_count], v_count, &got_dense[t * v_count]);
          for (std::size_t v = v_count; v < s_count; ++v) {
            padding_zero = padding_zero && got_padded[t * s_count + v] == 0;
          }
        }
        const double gradient_error = relative_error(got_dense, widen(want_dlogits));
        CAPTURE(gradient_error);
        CHECK(gradient_error < tolerance);
        CHECK(padding_zero);

        // In place over a second copy of the logits: the same bits as the separate output.
        cu::Half* in_place = cu::upload_half(padded, precision, stream);
        cu::cross_entropy_backward(in_place, tokens, vocab, stride, device_targets, device_mask, device_whole_lse,
                                   scale, in_place, precision, stream);
        CHECK(bitwise_equal(cu::download_half(in_place, t_count * s_count, precision, stream), got_padded));

        for (void* buffer :
             {static_cast<void*>(logits), static_cast<void*>(device_targets), static_cast<void*>(device_mask),
              static_cast<void*>(lse), static_cast<void*>(target_logit), static_cast<void*>(device_whole_lse),
              static_cast<void*>(dlogits), static_cast<void*>(in_place)}) {
          cu::free_device(buffer);
        }
      }
    }
  }
}

TEST_CASE("multi-tensor AdamW matches the reference over three steps and refreshes the 16-bit weights",
          "[gpu][kernels]") {
  const DType precision = GENERATE(DType::kBFloat16, DType::kFloat16);
  INFO(megaplan::to_string(precision));
  const auto round = [precision](float value) { return cu::from_half(cu::to_half(value, precision), precision); };
  std::mt19937 generator(43);
  const cu::Stream stream;
  // Odd sizes packed back to back in one buffer: the 7-value tensor starts misaligned (scalar
  // path), the others aligned with ragged ends.
  const std::vector<std::size_t> sizes = {1, 7, 1000003};
  const std::vector<std::size_t> offsets = {0, 1, 8};
  const std::size_t total = 8 + sizes[2];
  constexpr int kSteps = 3;
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, grad_scale = 0.8f;
  for (float decay : {0.0f, 0.1f}) {
    INFO("weight decay " << decay);
    const std::vector<float> start = normal_values(total, 0.0f, 1.0f, generator);
    std::vector<float> first = normal_values(total, 0.0f, 0.01f, generator);
    std::vector<float> second = normal_values(total, 0.0f, 1e-4f, generator);
    for (float& value : second) value = std::abs(value);
    std::vector<std::vector<float>> gradients;
    for (int s = 0; s < kSteps; ++s) gradients.push_back(normal_values(total, 0.0f, 1.0f, generator));
    const std::vector<float> weight_decays = {decay, 0.0f, decay};  // the middle one as a bias

    float* master = cu::upload_floats(start, stream);
    float* exp_avg = cu::upload_floats(first, stream);
    float* exp_avg_sq = cu::upload_floats(second, stream);
    cu::Half* compute = cu::upload_half(std::vector<float>(total, 1e30f), precision, stream);  // poisoned
    std::vector<float*> device_gradients;
    for (const auto& g : gradients) device_gradients.push_back(cu::upload_floats(g, stream));

    // The descriptors hold the gradient pointers, so each step's gradient gets its own optimizer.
    std::vector<std::vector<float>> want_master(3), want_first(3), want_second(3);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      want_master[k].assign(&start[offsets[k]], &start[offsets[k]] + sizes[k]);
      want_first[k].assign(&first[offsets[k]], &first[offsets[k]] + sizes[k]);
      want_second[k].assign(&second[offsets[k]], &second[offsets[k]] + sizes[k]);
    }
    for (int s = 0; s < kSteps; ++s) {
      std::vector<cu::AdamwTensor> tensors;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t o = offsets[k];
        tensors.push_back({master + o, device_gradients[s] + o, exp_avg + o, exp_avg_sq + o,
                           k == 1 ? nullptr : compute + o, static_cast<int64_t>(sizes[k]), weight_decays[k]});
      }
      cu::MultiTensorAdamw optimizer(tensors, precision, stream);
      optimizer.step(s + 1, lr, beta1, beta2, eps, grad_scale, stream);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> scaled(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) scaled[i] = gradients[s][offsets[k] + i] * grad_scale;
        ref::AdamWParameters parameters;
        parameters.lr = lr;
        parameters.beta1 = beta1;
        parameters.beta2 = beta2;
        parameters.eps = eps;
        parameters.weight_decay = weight_decays[k];
        ref::adamw_step(want_master[k].data(), scaled.data(), want_first[k].data(), want_second[k].data(), sizes[k],
                        s + 1, parameters);
      }
    }
    const std::vector<float> got_master = cu::download_floats(master, total, stream);
    const std::vector<float> got_first = cu::download_floats(exp_avg, total, stream);
    const std::vector<float> got_second = cu::download_floats(exp_avg_sq, total, stream);
    const std::vector<float> got_compute = cu::download_half(compute, total, precision, stream);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      INFO("tensor of " << sizes[k] << " values");
      const std::size_t o = offsets[k];
      // The weights move by ~lr per step: compare the moves, not the weights, so the test sees them.
      std::vector<float> got_move(sizes[k]);
      std::vector<double> want_move(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        got_move[i] = got_master[o + i] - start[o + i];
        want_move[i] = static_cast<double>(want_master[k][i]) - start[o + i];
      }
      const double move_error = relative_error(got_move, want_move);
      const double first_error =
          relative_error(std::vector<float>(&got_first[o], &got_first[o] + sizes[k]), widen(want_first[k]));
      const double second_error =
          relative_error(std::vector<float>(&got_second[o], &got_second[o] + sizes[k]), widen(want_second[k]));
      CAPTURE(move_error, first_error, second_error);
      CHECK(move_error < 1e-3);
      CHECK(first_error < 1e-5);
      CHECK(second_error < 1e-5);
      bool compute_as_expected = true;
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        const float want = k == 1 ? round(1e30f) : round(got_master[o + i]);
        compute_as_expected = compute_as_expected && got_compute[o + i] == want;
      }
      CHECK(compute_as_expected);  // round to nearest even of master; untouched where compute is null
    }
    for (void* buffer : {static_cast<void*>(master), static_cast<void*>(exp_avg), static_cast<void*>(exp_avg_sq),
                         static_cast<void*>(compute)}) {
      cu::free_device(buffer);
    }
    for (float* g : device_gradients) cu::free_device(g);
  }
}

TEST_CASE("device sums and sums of squares match double math and repeat bit for bit", "[gpu][kernels]") {
  std::mt19937 generator(47);
  const cu::Stream stream;
  cu::DeviceReducer reducer;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000003}, std::size_t{4096 * 1024 + 5}}) {
    INFO("n " << n);
    const std::vector<float> values = normal_values(n + 1, 0.3f, 1.0f, generator);
    float* device = cu::upload_floats(values, stream);
    for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {  // aligned, and misaligned by one float
      const int64_t count = static_cast<int64_t>(n);
      double want = 0;
      for (std::size_t i = 0; i < n; ++i) want += values[shift + i];
      const double got = reducer.sum(device + shift, count, stream);
      CAPTURE(shift, got, want);
      CHECK(std::abs(got - want) <= 1e-10 * std::max(1.0, std::abs(want)));
      const double again = reducer.sum(device + shift, count, stream);
      CHECK(std::memcmp(&got, &again, sizeof got) == 0);
    }
    cu::free_device(device);
  }

  const std::vector<std::size_t> sizes = {1, 7, 1000003, 0, 3000000};
  std::vector<std::vector<float>> host;
  std::vector<float*> device;
  std::vector<cu::TensorSpan> spans;
  double want = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    host.push_back(normal_values(sizes[k] + 1, 0.0f, 1.0f + static_cast<float>(k), generator));
    device.push_back(cu::upload_floats(host.back(), stream));
    const std::size_t shift = k % 2;  // every other tensor misaligned
    spans.push_back({device.back() + shift, static_cast<int64_t>(sizes[k])});
    for (std::size_t i = 0; i < sizes[k]; ++i) want += static_cast<double>(host[k][shift + i]) * host[k][shift + i];
  }
  const double got = reducer.sum_of_squares(spans, stream);
  CAPTURE(got, want);
  CHECK(std::abs(got - want) <= 1e-11 * want);
  (void)reducer.sum(device[2], 5, stream);  // another list in between: the descriptors are uploaded again
  const double again = reducer.sum_of_squares(spans, stream);
  CHECK(std::memcmp(&got, &again, sizeof got) == 0);
  cu::DeviceReducer other;  // a fresh reducer, fresh scratch: the same bits
  const double fresh = other.sum_of_squares(spans, stream);
  CHECK(std::memcmp(&got, &fresh, sizeof got) == 0);
  for (float* d : device) cu::free_device(d);
}
