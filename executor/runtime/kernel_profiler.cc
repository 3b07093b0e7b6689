#include "executor/runtime/kernel_profiler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/model_presets.h"
#include "core/model_spec.h"
#include "core/moe_spec.h"
#include "executor/runtime/median.h"

namespace megaplan::exec {

namespace {

// A sequence's launches rotate over copies of its buffers holding at least this many bytes in all,
// four times the 50 MB L2 of an H100 or H200: each pass reads its operands from HBM, as training's
// kernels mostly do, not from the cache the previous pass filled.
constexpr int64_t kRotatedBytes = int64_t{200} << 20;
constexpr int64_t kMaxCopies = 64;
// A cell whose distinct kernels move more than this (each has buffers of its own) is timed a
// kernel at a time instead: the largest, 16384 tokens of width 8192, would need more than an H100
// holds. Its
// kernels are the longest and draw the most power, so alone they run at the clock a step of them
// would (the power limit).
constexpr int64_t kMaxCellBytes = int64_t{16} << 30;
// A cell's warm-up (ProfileSequence::warmup_seconds), as the profiles validated in
// docs/results.md were taken.
constexpr double kCellWarmupSeconds = 0.5;

// Where each kernel of a sequence is listed first: a kernel listed again (the next layer's) shares
// that listing's launch and buffers (SequenceLaunches).
std::vector<std::size_t> first_listings(const std::vector<Kernel>& kernels) {
  std::vector<std::size_t> first(kernels.size());
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    first[i] = static_cast<std::size_t>(std::find(kernels.begin(), kernels.end(), kernels[i]) - kernels.begin());
  }
  return first;
}

// What a sequence's buffers hold: each distinct kernel's once.
int64_t distinct_kernel_bytes(const std::vector<Kernel>& kernels, int64_t activation_bytes) {
  const std::vector<std::size_t> first = first_listings(kernels);
  int64_t bytes = 0;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    if (first[i] == i) bytes += kernel_bytes(kernels[i], activation_bytes);
  }
  return bytes;
}

// One sequence's launches, a pass at a time over its copies. Within a copy a kernel listed again
// (the next layer's) reuses the launch of its first listing, buffers and all: a cell of many layers
// costs the memory of one. A sequence holding the optimizer's kernels keeps one copy: the backend
// prepares a launch per tensor list (as training's list never changes), which rotating would redo.
class SequenceLaunches {
 public:
  SequenceLaunches(Backend& backend, const ProfileSequence& sequence, int64_t activation_bytes) {
    const std::vector<std::size_t> first_listing = first_listings(sequence.kernels);
    const int64_t bytes = distinct_kernel_bytes(sequence.kernels, activation_bytes);
    const bool one_list = std::any_of(sequence.kernels.begin(), sequence.kernels.end(), [](const Kernel& kernel) {
      return kernel.kind == KernelKind::kAdamw || kernel.kind == KernelKind::kGradientNorm;
    });
    const int64_t copies =
        one_list ? 1 : std::clamp<int64_t>((kRotatedBytes + bytes - 1) / std::max<int64_t>(bytes, 1), 1, kMaxCopies);
    copies_.resize(static_cast<std::size_t>(copies));
    for (auto& copy : copies_) {
      for (std::size_t i = 0; i < sequence.kernels.size(); ++i) {
        if (first_listing[i] == i) {
          owned_.push_back(std::make_unique<KernelLaunch>(backend, sequence.kernels[i], sequence.table));
          copy.push_back(owned_.back().get());
        } else {
          copy.push_back(copy[first_listing[i]]);
        }
      }
    }
  }
  // One pass over the next copy; `after(i)` follows kernel i.
  template <typename After>
  void pass(After&& after) {
    const auto& copy = copies_[next_];
    for (std::size_t i = 0; i < copy.size(); ++i) {
      (*copy[i])();
      after(i);
    }
    next_ = (next_ + 1) % copies_.size();
  }
  void pass() {
    pass([](std::size_t) {});
  }

 private:
  std::vector<std::unique_ptr<KernelLaunch>> owned_;
  std::vector<std::vector<KernelLaunch*>> copies_;
  std::size_t next_ = 0;
};

// Seconds per kernel of a sequence: one vector of samples (one per repetition) per kernel, in order.
struct SequenceTiming {
  std::vector<std::vector<double>> kernel_seconds;
  double mark_seconds;  // median over the repetitions
};

SequenceTiming time_sequence(Backend& backend, const ProfileGrid& grid, const ProfileSequence& sequence) {
  const std::size_t count = sequence.kernels.size();
  SequenceLaunches launches(backend, sequence, static_cast<int64_t>(backend.activation_bytes()));
  // A first pass (cuBLASLt picks its algorithms, caches fill) sizes the warm-up and the repetitions.
  const TimingMark before = backend.mark();
  launches.pass();
  const double first = std::max(backend.seconds_between(before, backend.mark()), 1e-9);
  backend.release_marks();
  const auto warmup = std::max<int64_t>(1, static_cast<int64_t>(sequence.warmup_seconds / first));
  for (int64_t i = 0; i < warmup; ++i) launches.pass();
  const int repetitions =
      std::clamp(static_cast<int>(std::ceil(grid.target_seconds / first)), grid.min_repetitions, grid.max_repetitions);
  // Everything is queued before anything is read, so the device never waits for the host.
  std::vector<TimingMark> marks;
  marks.reserve(static_cast<std::size_t>(repetitions) * (count + 2));
  for (int r = 0; r < repetitions; ++r) {
    marks.push_back(backend.mark());
    launches.pass();
    marks.push_back(backend.mark());  // ends the unmarked pass, starts the marked one
    launches.pass([&](std::size_t) { marks.push_back(backend.mark()); });
  }
  SequenceTiming timing{std::vector<std::vector<double>>(count), 0};
  std::vector<double> mark_costs;
  for (int r = 0; r < repetitions; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * (count + 2);
    const double unmarked = backend.seconds_between(marks[at], marks[at + 1]);
    std::vector<double> intervals(count);
    double marked = 0;
    for (std::size_t i = 0; i < count; ++i) {
      intervals[i] = backend.seconds_between(marks[at + 1 + i], marks[at + 2 + i]);
      marked += intervals[i];
    }
    const double cost = std::max(0.0, (marked - unmarked) / static_cast<double>(count));
    mark_costs.push_back(cost);
    // A CPU kernel too quick for the steady clock reads 0: the schema wants a positive time.
    for (std::size_t i = 0; i < count; ++i) timing.kernel_seconds[i].push_back(std::max(intervals[i] - cost, 1e-9));
  }
  backend.release_marks();
  timing.mark_seconds = median_of(mark_costs);
  return timing;
}

// A kernel's samples from every sequence it appeared in: the table's median and spread.
struct Samples {
  std::vector<double> seconds;
  void add(const std::vector<double>& more) { seconds.insert(seconds.end(), more.begin(), more.end()); }
  double median() const { return median_of(seconds); }
  double spread() const {
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const auto at = [&](double quantile) {
      return sorted[static_cast<std::size_t>(quantile * static_cast<double>(sorted.size() - 1) + 0.5)];
    };
    return (at(0.9) - at(0.1)) / median();
  }
};

using GemmKey = std::tuple<int64_t, int64_t, int64_t, GemmLayout, GemmEpilogue, DType>;
using MemoryKey = std::pair<std::string, int64_t>;
// batch x heads, seq, head dim, GQA ratio, dropout, a ring block (else the whole attention), causal
// (a ring block: on the diagonal)
using AttentionKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;

GemmKey gemm_key(const Kernel& k) { return {k.m, k.n, k.k, k.layout, k.epilogue, k.precision}; }
bool is_ring_block(const Kernel& k) {
  return k.kind == KernelKind::kAttentionBlockForward || k.kind == KernelKind::kAttentionBlockBackward;
}
bool is_attention(const Kernel& k) {
  return k.kind == KernelKind::kAttentionForward || k.kind == KernelKind::kAttentionBackward || is_ring_block(k);
}
AttentionKey attention_key(const Kernel& k) {
  const bool block = is_ring_block(k);
  return {k.batch * k.heads, k.seq, k.head_dim, gqa_ratio(k), k.dropout, block, !block || k.diagonal};
}

// The same kernels with fp16 GEMMs: Megatron's --fp16 step as far as the executor's kernels go.
std::vector<Kernel> with_fp16_gemms(std::vector<Kernel> kernels) {
  for (Kernel& kernel : kernels) {
    if (kernel.kind == KernelKind::kGemm) kernel.precision = DType::kFloat16;
  }
  return kernels;
}

bool has_fp16_gemm(const ProfileSequence& sequence) {
  return std::any_of(sequence.kernels.begin(), sequence.kernels.end(), [](const Kernel& kernel) {
    return kernel.kind == KernelKind::kGemm && kernel.precision == DType::kFloat16;
  });
}

// Entries in the order kernels were first met.
template <typename Key>
class Table {
 public:
  Samples& at(const Key& key) {
    const auto [it, fresh] = index_.emplace(key, entries_.size());
    if (fresh) entries_.emplace_back(key, Samples{});
    return entries_[it->second].second;
  }
  const std::vector<std::pair<Key, Samples>>& entries() const { return entries_; }

 private:
  std::map<Key, std::size_t> index_;
  std::vector<std::pair<Key, Samples>> entries_;
};

// A GPT of width h as plans make them: heads of 64 below 2048 (GPT-2) and of 128 from there (GPT-3,
// Llama) over sequences of 1024 and 2048 tokens, a 4h MLP, GPT-2's vocabulary, `tokens` a whole
// number of sequences, and GPT-2's twelve layers: the output layer's share of the step, whose
// kernels draw more power than a layer's, is then a model's, not a one-layer toy's.
ModelSpec gpt_of_width(int64_t hidden, int64_t tokens) {
  ModelSpec model;
  model.name = "profile";
  model.num_layers = 12;
  model.hidden_size = hidden;
  model.num_attention_heads = hidden / (hidden < 2048 ? 64 : 128);
  model.seq_length = std::min<int64_t>(tokens, hidden < 2048 ? 1024 : 2048);
  model.vocab_size = 50257;
  return model;
}

// A Llama of width h as Meta's Llama 3 family makes them (RMSNorm, SwiGLU, RoPE, 8 query groups,
// untied, no biases, Llama 3's vocabulary): heads of 64 at width 2048 (Llama 3.2 1B) and of 128
// above (Llama 3 8B), their MLP widths, sequences of 4096 tokens, twelve layers as gpt_of_width's.
ModelSpec llama_of_width(int64_t hidden, int64_t tokens) {
  ModelSpec model = model_preset("llama3-8b");
  model.name = "profile";
  model.num_layers = 12;
  model.hidden_size = hidden;
  model.num_attention_heads = hidden / (hidden <= 2048 ? 64 : 128);
  model.ffn_hidden_size = hidden <= 2048 ? 4 * hidden : 3584 * hidden / 1024;
  model.seq_length = std::min<int64_t>(tokens, 4096);
  return model;
}

// One cell: a microbatch of `tokens` tokens (a whole number of sequences) through `model` at
// tensor-parallel size `tensor_parallel_size`.
struct Cell {
  ModelSpec model;
  int64_t tokens;
  int64_t tensor_parallel_size;
};

}  // namespace

ProfileGrid profile_grid(bool quick) {
  const std::vector<int64_t> tokens =
      quick ? std::vector<int64_t>{2048, 8192} : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  // Widths 1280 and 1600 (GPT-2 large and XL, heads of 64) too: interpolated between 1024 and 2048,
  // gpt2-1.5b's forward and backward read 8% short on an H200.
  const std::vector<int64_t> widths =
      quick ? std::vector<int64_t>{768, 2048, 4096} : std::vector<int64_t>{768, 1024, 1280, 1600, 2048, 4096, 8192};
  const std::vector<int64_t> shards = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8};
  std::vector<Cell> cells;
  for (const int64_t m : tokens) {
    for (const int64_t h : widths) {
      for (const int64_t t : shards) cells.push_back({gpt_of_width(h, m), m, t});
    }
  }
  // The Llama family's kernels (RMSNorm, SwiGLU, rotary embedding, grouped attention, its MLP and
  // vocabulary's GEMMs), at the shapes of Llama 3.2 1B and Llama 3 8B, microbatches of 1, 2 and 4
  // sequences: a GEMM's throughput is not smooth in its token count (cuBLASLt's choices), and
  // interpolated between 4096 and 16384 tokens SwiGLU's weight gradient at 8192 read 18% short.
  for (const int64_t m : quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192, 16384}) {
    for (const int64_t h : quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 4096}) {
      for (const int64_t t : quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2}) {
        cells.push_back({llama_of_width(h, m), m, t});
      }
    }
  }
  // Mixtures of experts (issue 40) at tp 1, as train runs them: Mixtral's layer (8 SwiGLU experts of
  // the MLP's width, top 2, the switch and z losses) on those Llamas, whose experts' GEMMs run over
  // a quarter of the tokens; and Qwen2-MoE's (16 narrower experts, a shared expert behind its gate,
  // the sequence aux loss) on the smaller.
  for (const int64_t m : quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192, 16384}) {
    for (const int64_t h : quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 4096}) {
      ModelSpec mixtral = llama_of_width(h, m);
      mixtral.moe.num_experts = 8;
      mixtral.moe.router_topk = 2;
      mixtral.moe.aux_loss_coeff = 0.01;
      mixtral.moe.z_loss_coeff = 0.001;
      cells.push_back({mixtral, m, 1});
    }
    ModelSpec qwen = llama_of_width(2048, m);
    qwen.moe.num_experts = 16;
    qwen.moe.ffn_hidden_size = 1408;
    qwen.moe.router_topk = 4;
    qwen.moe.router_pre_softmax = true;
    qwen.moe.shared_expert_intermediate_size = 5632;
    qwen.moe.shared_expert_gate = true;
    qwen.moe.load_balancing = LoadBalancing::kSeqAuxLoss;
    qwen.moe.aux_loss_coeff = 0.001;
    cells.push_back({qwen, m, 1});
    // Qwen3's query and key norms (--qk-layernorm), at Qwen3-1.7B's heads (16 of 128, 8 groups).
    ModelSpec qwen3 = llama_of_width(2048, m);
    qwen3.qk_layernorm = true;
    qwen3.num_attention_heads = 16;
    qwen3.kv_channels = 128;
    cells.push_back({qwen3, m, 1});
  }
  ProfileGrid grid;
  // Each cell's forward and backward in training order, then the same with fp16 GEMMs (Megatron's
  // --fp16); what other blocks launch beside them, once per distinct point (GEMMs by shape, layout,
  // epilogue and precision; memory-bound kernels by class and bytes, the x-axis of their curves),
  // alone.
  std::set<GemmKey> gemms;
  std::set<MemoryKey> memory_bound;
  const auto fresh = [&](const Kernel& kernel) {
    if (is_attention(kernel) || kernel.kind == KernelKind::kElementwise) {
      return false;  // attention has its own grid; the executor launches no kElementwise
    }
    return kernel.kind == KernelKind::kGemm
               ? gemms.insert(gemm_key(kernel)).second
               : memory_bound.emplace(memory_kernel_class(kernel), kernel_bytes(kernel, 2)).second;
  };
  // Every cell's microbatch first, so that no kernel one of them runs is also timed alone.
  struct Planned {
    const ModelSpec* model;
    ParallelPlan plan;
    PlanKernels list;
    EmbeddingTable table;
  };
  std::vector<Planned> planned;
  for (const auto& [model, m, t] : cells) {
    if (model.effective_num_query_groups() % t != 0) continue;  // no plan shards these heads so
    ParallelPlan plan;
    plan.tensor_parallel_size = t;
    plan.micro_batch_size = m / model.seq_length;
    planned.push_back({&model, plan, PlanKernels(model, plan), {padded_vocab_size(model, t) / t, model.seq_length}});
    const PlanKernels& list = planned.back().list;
    std::vector<Kernel> microbatch = list.stage_kernels(0, SchedulePart::kForward);
    const std::vector<Kernel> backward = list.stage_kernels(0, SchedulePart::kBackward);
    microbatch.insert(microbatch.end(), backward.begin(), backward.end());
    if (distinct_kernel_bytes(microbatch, 2) > kMaxCellBytes) continue;
    for (const bool fp16 : {false, true}) {
      const std::vector<Kernel> kernels = fp16 ? with_fp16_gemms(microbatch) : microbatch;
      for (const Kernel& kernel : kernels) (void)fresh(kernel);
      grid.sequences.push_back({kernels, planned.back().table, kCellWarmupSeconds});
    }
  }
  std::vector<ProfileSequence> alone;
  for (const auto& [model_of, plan, list, table] : planned) {
    const ModelSpec& model = *model_of;
    for (const bool fp16 : {false, true}) {
      for (std::size_t b = 0; b < kNumKernelBlocks; ++b) {
        std::vector<Kernel> block = list.block(static_cast<KernelBlock>(b));
        if (fp16) block = with_fp16_gemms(block);
        for (const Kernel& kernel : block) {
          if (fresh(kernel)) alone.push_back({{kernel}, table});
        }
      }
    }
    // With --hidden-dropout the blocks gain dropout kernels (kernel_list.h): timed alone too.
    ParallelPlan dropped = plan;
    dropped.options.hidden_dropout = 0.1;
    const PlanKernels with_dropout(model, dropped);
    for (std::size_t b = 0; b < kNumKernelBlocks; ++b) {
      for (const Kernel& kernel : with_dropout.block(static_cast<KernelBlock>(b))) {
        if (fresh(kernel)) alone.push_back({{kernel}, table});
      }
    }
    // Context parallelism's ring around its blocks (packing the keys and values, zeroing, the fp32
    // output's fill and conversion, the gradients' sums and unpacking), the microbatch at cp 2.
    if (model.moe.enabled()) continue;  // MoE layers do not run under cp yet
    ParallelPlan ring = plan;
    ring.context_parallel_size = 2;
    const PlanKernels with_ring(model, ring);
    for (const RingAttention* pass : {&with_ring.ring().forward, &with_ring.ring().backward}) {
      for (const Kernel& kernel : pass->kernels()) {
        if (fresh(kernel)) alone.push_back({{kernel}, table});
      }
    }
  }
  grid.sequences.insert(grid.sequences.end(), alone.begin(), alone.end());
  // Attention's grid, whole and in the ring's blocks alike: each length and batch-heads, head
  // dimensions 64 and 128, multi-head and grouped as Llama 3 (4 query heads per key-value head at
  // 8B, 8 at 70B), and with --attention-dropout, whose kernels draw each probability's keep bit.
  const auto for_each_attention_shape = [&](const std::vector<int64_t>& lengths,
                                            const std::vector<int64_t>& batch_heads, const auto& add) {
    for (const int64_t length : lengths) {
      for (const int64_t bh : batch_heads) {
        for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
          for (const int64_t ratio : quick ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{1, 4, 8}) {
            if (bh % ratio != 0) continue;  // 12 heads in groups of 8 would be a 12:1 kernel, timed as such
            for (const bool dropout : {false, true}) add(length, bh, dim, bh / ratio, dropout);
          }
        }
      }
    }
  };
  // Batch-heads at half-octave steps: at octaves only, the leave-one-out check missed by 5-14% in the
  // median (an attention kernel's time is not smooth in its count of thread blocks), and plans land
  // between the octaves (gpt2-774m's 20 heads x 4 sequences are 80).
  for_each_attention_shape(
      quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096, 8192},
      quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{8, 12, 16, 24, 32, 48, 64, 96, 128},
      [&](int64_t seq, int64_t bh, int64_t dim, int64_t groups, bool dropout) {
        grid.sequences.push_back({{attention_kernel(KernelKind::kAttentionForward, 1, seq, bh, dim, groups, dropout),
                                   attention_kernel(KernelKind::kAttentionBackward, 1, seq, bh, dim, groups, dropout)},
                                  {}});
      });
  // Context parallelism's ring blocks (core/context_parallel.h): chunks of 64 to 8192 tokens
  // (sequences of 1 Ki over cp 8 to 128 Ki over cp 8), on the diagonal and unmasked. Short chunks
  // run far below the long ones' rate (a launch and a pass over the fp32 output), so the table
  // holds them rather than extrapolating.
  for_each_attention_shape(
      quick ? std::vector<int64_t>{128, 1024, 4096} : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048, 4096, 8192},
      quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{8, 16, 32, 64},
      [&](int64_t chunk, int64_t bh, int64_t dim, int64_t groups, bool dropout) {
        for (const bool diagonal : {true, false}) {
          grid.sequences.push_back({{attention_block_kernel(KernelKind::kAttentionBlockForward, 1, chunk, bh, dim,
                                                            groups, dropout, diagonal),
                                     attention_block_kernel(KernelKind::kAttentionBlockBackward, 1, chunk, bh, dim,
                                                            groups, dropout, diagonal)},
                                    {}});
        }
      });
  // The optimizer's kernels over 1 Mi to 1 Gi parameters (quick: 4 Mi and 64 Mi).
  const int64_t smallest = int64_t{1} << (quick ? 22 : 20), largest = int64_t{1} << (quick ? 26 : 30);
  for (int64_t n = smallest; n <= largest; n *= quick ? 16 : 4) {
    for (const KernelKind kind :
         {KernelKind::kGradientNorm, KernelKind::kAdamw, KernelKind::kRefreshCompute, KernelKind::kFill}) {
      const Kernel kernel = flat_kernel(kind, n);
      if (fresh(kernel)) grid.sequences.push_back({{kernel}, {}});
    }
  }
  // The expert bias's update at OPTIM (--moe-router-enable-expert-bias): one block over a layer's
  // experts, Mixtral's 8 to DeepSeek-V3's 256 (its time is its launch).
  for (const int64_t experts : quick ? std::vector<int64_t>{64} : std::vector<int64_t>{8, 64, 256}) {
    const Kernel kernel = row_kernel(KernelKind::kMoeUpdateExpertBias, 1, experts);
    if (fresh(kernel)) grid.sequences.push_back({{kernel}, {}});
  }
  return grid;
}

std::vector<Kernel> layer_kernels(int64_t hidden, int64_t tokens) {
  const ModelSpec model = gpt_of_width(hidden, tokens);
  ParallelPlan plan;
  plan.micro_batch_size = tokens / model.seq_length;
  const PlanKernels list(model, plan);
  std::vector<Kernel> kernels = list.block(KernelBlock::kLayerForward);
  const std::vector<Kernel>& backward = list.block(KernelBlock::kLayerBackward);
  kernels.insert(kernels.end(), backward.begin(), backward.end());
  return kernels;
}

MeasuredTables measure_kernels(Backend& backend, const ProfileGrid& grid,
                               const std::function<void(int64_t done, int64_t total)>& progress) {
  if (grid.min_repetitions < 1 || grid.max_repetitions < grid.min_repetitions) {
    throw std::invalid_argument("measure_kernels: repetitions must satisfy 1 <= min <= max");
  }
  const auto total = static_cast<int64_t>(grid.sequences.size());
  int64_t done = 0;
  const auto activation_bytes = static_cast<int64_t>(backend.activation_bytes());
  Table<GemmKey> gemms;
  Table<MemoryKey> memory_bound;
  Table<AttentionKey> forward, backward;
  std::vector<double> mark_costs;
  const bool fp16 = backend.runs_fp16_gemms();
  for (const ProfileSequence& sequence : grid.sequences) {
    if (sequence.kernels.empty()) throw std::invalid_argument("measure_kernels: an empty sequence");
    if (!fp16 && has_fp16_gemm(sequence)) {  // the CPU backend computes in fp32 only
      if (progress) progress(++done, total);
      continue;
    }
    const SequenceTiming timing = time_sequence(backend, grid, sequence);
    mark_costs.push_back(timing.mark_seconds);
    for (std::size_t i = 0; i < sequence.kernels.size(); ++i) {
      const Kernel& kernel = sequence.kernels[i];
      const std::vector<double>& seconds = timing.kernel_seconds[i];
      switch (kernel.kind) {
        case KernelKind::kGemm: gemms.at(gemm_key(kernel)).add(seconds); break;
        case KernelKind::kAttentionForward:
        case KernelKind::kAttentionBlockForward: forward.at(attention_key(kernel)).add(seconds); break;
        case KernelKind::kAttentionBackward:
        case KernelKind::kAttentionBlockBackward: backward.at(attention_key(kernel)).add(seconds); break;
        default: memory_bound.at({memory_kernel_class(kernel), kernel_bytes(kernel, activation_bytes)}).add(seconds);
      }
    }
    if (progress) progress(++done, total);
  }
  MeasuredTables tables;
  tables.mark_seconds = median_of(mark_costs);
  const std::string activation_dtype = to_string(backend.activation_type());
  for (const auto& [key, samples] : gemms.entries()) {
    const auto& [m, n, k, layout, epilogue, precision] = key;
    tables.gemm.push_back({{"m", m},
                           {"n", n},
                           {"k", k},
                           {"dtype", precision == DType::kFloat16 ? "fp16" : activation_dtype},
                           {"layout", to_string(layout)},
                           {"epilogue", to_string(epilogue)},
                           {"seconds", samples.median()},
                           {"spread", samples.spread()}});
  }
  for (const auto& [key, forward_samples] : forward.entries()) {
    Samples& backward_samples = backward.at(key);
    if (backward_samples.seconds.empty()) continue;  // the table holds both directions
    const auto& [batch_heads, seq, head_dim, ratio, dropout, ring_block, causal] = key;
    nlohmann::json entry = {{"batch_heads", batch_heads},
                            {"seq", seq},
                            {"head_dim", head_dim},
                            {"gqa_ratio", ratio},
                            {"causal", causal},
                            {"forward_s", forward_samples.median()},
                            {"backward_s", backward_samples.median()},
                            {"spread", std::max(forward_samples.spread(), backward_samples.spread())}};
    if (dropout) entry["dropout"] = true;
    if (ring_block) entry["ring_block"] = true;
    tables.attention.push_back(std::move(entry));
  }
  for (const auto& [key, samples] : memory_bound.entries()) {
    tables.kernels.push_back(
        {{"kernel", key.first}, {"bytes", key.second}, {"seconds", samples.median()}, {"spread", samples.spread()}});
  }
  return tables;
}

}  // namespace megaplan::exec
