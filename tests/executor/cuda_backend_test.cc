// The CUDA backend against the CPU backend, operation by operation, on fresh random inputs
// (outputs poisoned first, so an unwritten element fails), then a tiny GPT trained on the GPU:
// its loss falls as on the CPU, and a resumed run repeats the uninterrupted one bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "executor/data/prepare.h"
#include "executor/runtime/cpu_backend.h"
#include "executor/runtime/cuda_backend.h"
#include "executor/train/trainer.h"
#include "training_fixtures.h"

namespace {

using megaplan::exec::Backend;

std::vector<float> random_vector(std::size_t n, std::mt19937& generator, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

// A buffer on each backend holding the same host values.
struct Pair {
  float* cpu;
  float* gpu;
  std::size_t n;
};

class Both {
 public:
  Both() : gpu_(megaplan::exec::make_cuda_backend()) {}
  Pair make(const std::vector<float>& host) {
    Pair pair{cpu_.allocate(host.size()), gpu_->allocate(host.size()), host.size()};
    cpu_.upload(pair.cpu, host.data(), host.size());
    gpu_->upload(pair.gpu, host.data(), host.size());
    return pair;
  }
  Pair output(std::size_t n) { return make(std::vector<float>(n, 1e30f)); }  // poisoned
  // ||gpu - cpu|| / ||cpu||, with a NaN or an unwritten element failing.
  double error(const Pair& pair) {
    std::vector<float> a(pair.n), b(pair.n);
    cpu_.download(a.data(), pair.cpu, pair.n);
    gpu_->download(b.data(), pair.gpu, pair.n);
    double difference = 0, norm = 0;
    for (std::size_t i = 0; i < pair.n; ++i) {
      if (!std::isfinite(b[i]) || std::abs(b[i]) > 1e29f) return INFINITY;
      difference += (static_cast<double>(b[i]) - a[i]) * (static_cast<double>(b[i]) - a[i]);
      norm += static_cast<double>(a[i]) * a[i];
    }
    return std::sqrt(difference / std::max(norm, 1e-30));
  }
  megaplan::exec::CpuBackend& cpu() { return cpu_; }
  Backend& gpu() { return *gpu_; }

 private:
  megaplan::exec::CpuBackend cpu_;
  std::unique_ptr<Backend> gpu_;
};

constexpr double kFp32 = 1e-5;

}  // namespace

TEST_CASE("every CUDA operation matches the CPU backend", "[gpu][kernels]") {
  std::mt19937 generator(17);
  Both both;
  const std::size_t m = 37, k = 24, n = 19;
  SECTION("linear") {
    Pair x = both.make(random_vector(m * k, generator)), w = both.make(random_vector(n * k, generator)),
         b = both.make(random_vector(n, generator)), y = both.output(m * n);
    both.cpu().linear_forward(x.cpu, w.cpu, b.cpu, m, k, n, y.cpu);
    both.gpu().linear_forward(x.gpu, w.gpu, b.gpu, m, k, n, y.gpu);
    CHECK(both.error(y) < kFp32);
    Pair dy = both.make(random_vector(m * n, generator)), dx = both.output(m * k),
         dw = both.make(random_vector(n * k, generator)), db = both.make(random_vector(n, generator));
    both.cpu().linear_backward(dy.cpu, x.cpu, w.cpu, m, k, n, dx.cpu, dw.cpu, db.cpu);
    both.gpu().linear_backward(dy.gpu, x.gpu, w.gpu, m, k, n, dx.gpu, dw.gpu, db.gpu);
    CHECK(both.error(dx) < kFp32);
    CHECK(both.error(dw) < kFp32);
    CHECK(both.error(db) < kFp32);
  }
  SECTION("embedding") {
    const std::size_t vocab = 11, seq = 5, hidden = 6, count = 20;
    std::vector<int64_t> tokens(count);
    for (int64_t& t : tokens) t = static_cast<int64_t>(generator() % vocab);
    Pair word = both.make(random_vector(vocab * hidden, generator)), position = both.make(random_vector(seq * hidden, generator));
    Pair y = both.output(count * hidden);
    both.cpu().embedding_forward(tokens.data(), count, seq, word.cpu, position.cpu, hidden, y.cpu);
    both.gpu().embedding_forward(tokens.data(), count, seq, word.gpu, position.gpu, hidden, y.gpu);
    CHECK(both.error(y) < kFp32);
    Pair dy = both.make(random_vector(count * hidden, generator));
    Pair dword = both.make(random_vector(vocab * hidden, generator)), dposition = both.make(random_vector(seq * hidden, generator));
    both.cpu().embedding_backward(dy.cpu, tokens.data(), count, seq, hidden, dword.cpu, dposition.cpu);
    both.gpu().embedding_backward(dy.gpu, tokens.data(), count, seq, hidden, dword.gpu, dposition.gpu);
    CHECK(both.error(dword) < kFp32);
    CHECK(both.error(dposition) < kFp32);
  }
  SECTION("layernorm and GELU") {
    Pair x = both.make(random_vector(m * k, generator, 3.0f)), gamma = both.make(random_vector(k, generator)),
         beta = both.make(random_vector(k, generator)), y = both.output(m * k), mean = both.output(m), rstd = both.output(m);
    both.cpu().layernorm_forward(x.cpu, gamma.cpu, beta.cpu, m, k, y.cpu, mean.cpu, rstd.cpu);
    both.gpu().layernorm_forward(x.gpu, gamma.gpu, beta.gpu, m, k, y.gpu, mean.gpu, rstd.gpu);
    CHECK(both.error(y) < kFp32);
    CHECK(both.error(rstd) < kFp32);
    Pair dy = both.make(random_vector(m * k, generator)), dx = both.output(m * k),
         dgamma = both.make(random_vector(k, generator)), dbeta = both.make(random_vector(k, generator));
    both.cpu().layernorm_backward(dy.cpu, x.cpu, gamma.cpu, mean.cpu, rstd.cpu, m, k, dx.cpu, dgamma.cpu, dbeta.cpu);
    both.gpu().layernorm_backward(dy.gpu, x.gpu, gamma.gpu, mean.gpu, rstd.gpu, m, k, dx.gpu, dgamma.gpu, dbeta.gpu);
    CHECK(both.error(dx) < 1e-4);
    CHECK(both.error(dgamma) < kFp32);
    CHECK(both.error(dbeta) < kFp32);
    Pair g = both.output(m * k), dg = both.output(m * k);
    both.cpu().gelu_forward(x.cpu, m * k, g.cpu);
    both.gpu().gelu_forward(x.gpu, m * k, g.gpu);
    CHECK(both.error(g) < kFp32);
    both.cpu().gelu_backward(dy.cpu, x.cpu, m * k, dg.cpu);
    both.gpu().gelu_backward(dy.gpu, x.gpu, m * k, dg.gpu);
    CHECK(both.error(dg) < kFp32);
  }
  SECTION("attention") {
    const std::size_t batch = 2, seq = 33, heads = 3, dim = 16;
    Pair qkv = both.make(random_vector(batch * seq * 3 * heads * dim, generator));
    Pair out = both.output(batch * seq * heads * dim);
    Pair saved_cpu{both.cpu().allocate(both.cpu().attention_saved_size(batch, seq, heads, dim)), nullptr, 0};
    float* saved_gpu = both.gpu().allocate(both.gpu().attention_saved_size(batch, seq, heads, dim));
    both.cpu().attention_forward(qkv.cpu, batch, seq, heads, dim, out.cpu, saved_cpu.cpu);
    both.gpu().attention_forward(qkv.gpu, batch, seq, heads, dim, out.gpu, saved_gpu);
    CHECK(both.error(out) < kFp32);
    Pair dout = both.make(random_vector(batch * seq * heads * dim, generator));
    Pair dqkv = both.output(batch * seq * 3 * heads * dim);
    both.cpu().attention_backward(dout.cpu, qkv.cpu, saved_cpu.cpu, batch, seq, heads, dim, dqkv.cpu);
    both.gpu().attention_backward(dout.gpu, qkv.gpu, saved_gpu, batch, seq, heads, dim, dqkv.gpu);
    CHECK(both.error(dqkv) < 1e-4);
  }
  SECTION("cross entropy, reductions, AdamW") {
    const std::size_t tokens = 29, vocab = 101;
    Pair logits = both.make(random_vector(tokens * vocab, generator, 4.0f)), probs = both.output(tokens * vocab);
    std::vector<int64_t> targets(tokens);
    for (int64_t& t : targets) t = static_cast<int64_t>(generator() % vocab);
    std::vector<float> mask(tokens, 1.0f);
    mask[3] = 0.0f;
    const double cpu_loss = both.cpu().cross_entropy_forward(logits.cpu, targets.data(), mask.data(), tokens, vocab, probs.cpu);
    const double gpu_loss = both.gpu().cross_entropy_forward(logits.gpu, targets.data(), mask.data(), tokens, vocab, probs.gpu);
    CHECK(gpu_loss == Approx(cpu_loss).epsilon(kFp32));
    CHECK(both.error(probs) < kFp32);
    Pair dlogits = both.output(tokens * vocab);
    both.cpu().cross_entropy_backward(probs.cpu, targets.data(), mask.data(), tokens, vocab, 0.5f, dlogits.cpu);
    both.gpu().cross_entropy_backward(probs.gpu, targets.data(), mask.data(), tokens, vocab, 0.5f, dlogits.gpu);
    CHECK(both.error(dlogits) < kFp32);
    CHECK(both.gpu().sum_of_squares(logits.gpu, tokens * vocab) ==
          Approx(both.cpu().sum_of_squares(logits.cpu, tokens * vocab)).epsilon(1e-9));
    Pair w = both.make(random_vector(500, generator)), g = both.make(random_vector(500, generator)),
         first = both.make(std::vector<float>(500, 0.0f)), second = both.make(std::vector<float>(500, 0.0f));
    for (int64_t step = 1; step <= 3; ++step) {
      both.cpu().adamw_step(w.cpu, g.cpu, first.cpu, second.cpu, 500, step, 1e-2, 0.9, 0.95, 1e-8, 0.1);
      both.gpu().adamw_step(w.gpu, g.gpu, first.gpu, second.gpu, 500, step, 1e-2, 0.9, 0.95, 1e-8, 0.1);
    }
    CHECK(both.error(w) < kFp32);
    CHECK(both.error(second) < kFp32);
  }
}

TEST_CASE("a tiny GPT trains on the GPU and resumes bit for bit", "[gpu][train]") {
  const megaplan::test::ScratchDirectory scratch;
  const std::string corpus = megaplan::test::sentence_corpus(scratch);
  const megaplan::ModelSpec model = megaplan::test::tiny_gpt();
  megaplan::exec::TrainOptions options;
  options.train_iters = 40;
  options.micro_batch_size = 4;
  options.global_batch_size = 8;
  options.learning_rate.max_lr = 3e-3;
  options.learning_rate.warmup_iterations = 4;
  options.log_interval = 1;
  options.eval_iters = 0;
  options.split = "1,0,0";
  options.data_path = corpus;
  using megaplan::test::logged_losses;
  std::ostringstream out;
  options.log_file = scratch.file("whole.jsonl");
  megaplan::exec::train(model, options, *megaplan::exec::make_cuda_backend(), out);
  options.log_file = scratch.file("cpu.jsonl");
  {
    megaplan::exec::CpuBackend cpu;
    megaplan::exec::train(model, options, cpu, out);
  }
  options.log_file = scratch.file("parts.jsonl");
  options.save = scratch.file("checkpoints");
  options.exit_interval = 20;
  megaplan::exec::train(model, options, *megaplan::exec::make_cuda_backend(), out);
  options.exit_interval = 0;
  options.load = options.save;
  megaplan::exec::train(model, options, *megaplan::exec::make_cuda_backend(), out);
  const std::vector<double> whole = logged_losses(scratch.file("whole.jsonl")),
                            parts = logged_losses(scratch.file("parts.jsonl")), cpu = logged_losses(scratch.file("cpu.jsonl"));
  REQUIRE(whole.size() == 40);
  REQUIRE(parts.size() == 40);
  CHECK(whole.back() < 0.7 * whole.front());
  CHECK(whole.front() == Approx(cpu.front()).epsilon(1e-5));  // the same model and data on both backends
  for (std::size_t i = 0; i < 40; ++i) {
    INFO("iteration " << i + 1 << ": GPU " << whole[i] << ", CPU " << cpu[i]);
    CHECK(parts[i] == whole[i]);  // bit for bit on the device
    CHECK(whole[i] == Approx(cpu[i]).epsilon(2e-2));
  }
}
