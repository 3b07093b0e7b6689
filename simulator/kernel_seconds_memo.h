// A profile's answer for each kernel it was asked about, kept for the next time: a search costs the
// layers of thousands of plans, which ask again and again for the same GEMMs and attentions, and a
// GEMM's answer is a scan of the whole measured table. Safe to use from several threads.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/fnv1a.h"
#include "core/kernel_list.h"
#include "simulator/cost_sources.h"

namespace megaplan::sim {

class KernelSecondsMemo {
 public:
  KernelSecondsMemo() = default;
  // A copy starts empty: it may serve another profile (and a mutex is not copied).
  KernelSecondsMemo(const KernelSecondsMemo&) {}
  KernelSecondsMemo& operator=(const KernelSecondsMemo&) {
    const std::lock_guard lock(mutex_);
    answers_.clear();
    return *this;
  }
  // Not part of a profile's value: two profiles of equal tables are equal whatever they were asked.
  bool operator==(const KernelSecondsMemo&) const { return true; }

  // `compute(kernel, sources)`'s answer, computed once per distinct kernel; every call adds the
  // sources that computing it counted, as a call of its own would.
  template <class Compute>
  double get(const Kernel& kernel, CostSources& sources, const Compute& compute) const {
    {
      const std::lock_guard lock(mutex_);
      if (const auto found = answers_.find(kernel); found != answers_.end()) return found->second.add_to(sources);
    }
    Answer answer;
    answer.seconds = compute(kernel, answer.sources);
    const std::lock_guard lock(mutex_);
    return answers_.emplace(kernel, answer).first->second.add_to(sources);
  }

 private:
  struct Answer {
    double seconds = 0;
    CostSources sources;
    double add_to(CostSources& into) const {
      into.table += sources.table;
      into.fallback += sources.fallback;
      return seconds;
    }
  };
  struct Hash {
    std::size_t operator()(const Kernel& k) const {
      Fnv1a64 hash;
      hash.add_word(static_cast<uint64_t>(k.kind) | static_cast<uint64_t>(k.precision) << 8 |
                    static_cast<uint64_t>(k.layout) << 16 | static_cast<uint64_t>(k.epilogue) << 24 |
                    static_cast<uint64_t>(k.fused_residual) << 32 | static_cast<uint64_t>(k.dropout) << 33 |
                    static_cast<uint64_t>(k.diagonal) << 34);
      for (const int64_t field : {k.m, k.n, k.k, k.batch, k.seq, k.heads, k.head_dim, k.groups, k.rows, k.cols})
        hash.add_word(static_cast<uint64_t>(field));
      return static_cast<std::size_t>(hash.value());
    }
  };
  mutable std::mutex mutex_;
  mutable std::unordered_map<Kernel, Answer, Hash> answers_;
};

}  // namespace megaplan::sim
