// Catch2's main for the GPU tests: where no GPU is usable (none present, no driver, or a build
// without CUDA) it prints why and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE),
// instead of failing every test for a reason that has nothing to do with the code under test.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "core/error.h"
#include "executor/gpu_inventory.h"

namespace {
constexpr int kSkipped = 77;
}

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  const Catch::ConfigData& config = session.configData();
  const bool only_listing =
      config.showHelp || config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
  if (!only_listing) {
    try {
      (void)megaplan::query_gpu_inventory();
    } catch (const megaplan::SpecError& error) {
      std::cout << "megaplan_gpu_tests: skipped, no usable GPU: " << error.what() << "\n";
      return kSkipped;
    }
  }
  return session.run();
}
