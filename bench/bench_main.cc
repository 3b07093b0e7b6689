// The benchmark programs' main: Google Benchmark's, after megaplan's own allocator settings
// (core/heap_tuning.h), so that benchmarks run as megaplan's commands and the planner do.
#include <benchmark/benchmark.h>

#include "core/heap_tuning.h"

int main(int argc, char** argv) {
  megaplan::keep_freed_memory_for_reuse();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
