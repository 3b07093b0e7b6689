// What the checkpoint tests train with, compare and expect: their runs' options, a directory's files
// and a refused load.
#pragma once

#include <catch2/catch.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "executor/runtime/backend.h"
#include "executor/train/optimizer.h"
#include "executor/train/trainer.h"

namespace megaplan::test {

// Eight iterations on `corpus`, logged each, no validation: the runs the checkpoint tests save,
// resume and compare.
inline exec::TrainOptions checkpoint_training_options(const std::string& corpus) {
  exec::TrainOptions options;
  options.train_iters = 8;
  options.learning_rate.max_lr = 3e-3;
  options.learning_rate.warmup_iterations = 2;
  options.log_interval = 1;
  options.eval_interval = 100;
  options.eval_iters = 0;
  options.split = "1,0,0";
  options.data_path = corpus;
  options.distributed_timeout_minutes = 1;
  return options;
}

// Every file under `directory`, by relative path, with its bytes.
inline std::map<std::string, std::string> files_under(const std::string& directory) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(directory)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream file(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << file.rdbuf();
    files[fs::relative(entry.path(), directory).string()] = bytes.str();
  }
  return files;
}

// The byte at `offset` of the file `path` flipped (xor 0x5a): damage a checksum must catch.
inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(file.get());
  file.seekp(static_cast<std::streamoff>(offset));
  file.put(static_cast<char>(byte ^ 0x5a));
}

// A parameter's value and moments (first, then second) downloaded from a rank's optimizer.
struct ParameterState {
  const exec::Parameter* parameter;
  std::array<std::vector<float>, 3> arrays;
};
// Every parameter's, in the optimizer's order (chunk, then registration).
inline std::vector<ParameterState> parameter_states(exec::Optimizer& optimizer, exec::Backend& backend) {
  std::vector<ParameterState> states;
  optimizer.visit_moments([&](const exec::Parameter& parameter, const float* first, const float* second) {
    ParameterState& state = states.emplace_back();
    state.parameter = &parameter;
    const float* const sources[3] = {parameter.value, first, second};
    for (std::size_t a = 0; a < 3; ++a) {
      state.arrays[a].resize(parameter.size);
      backend.download(state.arrays[a].data(), sources[a], parameter.size);
    }
  });
  return states;
}

// The message of the SpecError naming --load that `load` throws (a test failure when none).
inline std::string load_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const SpecError& error) {
    CHECK(error.field() == "--load");
    return error.what();
  }
  FAIL("no SpecError");
  return "";
}

}  // namespace megaplan::test
