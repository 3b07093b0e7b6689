#include "executor/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_file.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

namespace {

std::string iteration_directory(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void save_checkpoint(const std::string& directory, const TrainingState& state,
                     const std::vector<ParameterState>& parameters, Backend& backend) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw SpecError("--save", directory + ": cannot create: " + error.message());
  const std::string final_path = directory + "/" + iteration_directory(state.iteration);
  const std::string staging = final_path + ".tmp";
  fs::remove_all(staging, error);
  if (!fs::create_directory(staging, error)) {
    throw SpecError("--save", staging + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  try {
    StagedFile weights(staging + "/model.bin");
    nlohmann::json listing = nlohmann::json::array();
    std::vector<float> host;
    for (const ParameterState& entry : parameters) {
      const Parameter& parameter = *entry.parameter;
      host.resize(parameter.size);
      for (const float* buffer : {static_cast<const float*>(parameter.value), static_cast<const float*>(entry.first_moment),
                                  static_cast<const float*>(entry.second_moment)}) {
        backend.download(host.data(), buffer, parameter.size);
        weights.write(host.data(), host.size() * sizeof(float));
      }
      listing.push_back({{"name", parameter.name}, {"size", parameter.size}});
    }
    weights.commit();
    const nlohmann::json meta = {{"format", "megaplan-checkpoint/1"},
                                 {"iteration", state.iteration},
                                 {"consumed_samples", state.consumed_samples},
                                 {"seed", state.seed},
                                 {"parameters", listing}};
    write_file_atomically(staging + "/state.json", meta.dump(2) + "\n");
    sync_directory(staging);
    fs::remove_all(final_path, error);  // a save at an iteration saved before replaces it
    fs::rename(staging, final_path, error);
    if (error) throw SpecError("--save", final_path + ": cannot rename into place: " + error.message());
    sync_directory(directory);
    write_file_atomically(directory + "/latest_checkpointed_iteration.txt", std::to_string(state.iteration) + "\n");
  } catch (...) {
    fs::remove_all(staging, error);
    throw;
  }
}

std::optional<TrainingState> load_checkpoint(const std::string& directory, const std::vector<ParameterState>& parameters,
                                             Backend& backend) {
  const std::string latest = directory + "/latest_checkpointed_iteration.txt";
  if (!std::filesystem::exists(latest)) return std::nullopt;
  const auto refuse = [&](const std::string& rule) -> SpecError { return SpecError("--load", directory + ": " + rule); };
  int64_t iteration = 0;
  try {
    iteration = std::stoll(read_text_file(latest));
  } catch (const std::exception&) {
    throw refuse("latest_checkpointed_iteration.txt holds no iteration number");
  }
  const std::string path = directory + "/" + iteration_directory(iteration);
  nlohmann::json meta = nlohmann::json::parse(read_text_file(path + "/state.json"), nullptr, false);
  if (meta.is_discarded() || meta.value("format", "") != "megaplan-checkpoint/1") {
    throw refuse(iteration_directory(iteration) + "/state.json is not a megaplan checkpoint");
  }
  const nlohmann::json& listing = meta["parameters"];
  if (!listing.is_array() || listing.size() != parameters.size()) {
    throw refuse("the checkpoint holds " + std::to_string(listing.size()) + " parameters, the model " +
                 std::to_string(parameters.size()));
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const Parameter& parameter = *parameters[i].parameter;
    if (listing[i].value("name", "") != parameter.name || listing[i].value("size", std::size_t{0}) != parameter.size) {
      throw refuse("parameter " + std::to_string(i) + " is " + listing[i].value("name", std::string("?")) +
                   " in the checkpoint but " + parameter.name + " in the model");
    }
    total += 3 * parameter.size * sizeof(float);
  }
  std::ifstream weights(path + "/model.bin", std::ios::binary);
  if (!weights) throw refuse(iteration_directory(iteration) + "/model.bin: cannot open");
  weights.seekg(0, std::ios::end);
  if (static_cast<std::size_t>(weights.tellg()) != total) {
    throw refuse(iteration_directory(iteration) + "/model.bin: " + std::to_string(static_cast<long long>(weights.tellg())) +
                 " bytes, the model needs " + std::to_string(total));
  }
  weights.seekg(0);
  std::vector<float> host;
  for (const ParameterState& entry : parameters) {
    const Parameter& parameter = *entry.parameter;
    host.resize(parameter.size);
    for (float* buffer : {parameter.value, entry.first_moment, entry.second_moment}) {
      weights.read(reinterpret_cast<char*>(host.data()), static_cast<std::streamsize>(host.size() * sizeof(float)));
      backend.upload(buffer, host.data(), parameter.size);
    }
  }
  TrainingState state;
  state.iteration = meta.value("iteration", int64_t{0});
  state.consumed_samples = meta.value("consumed_samples", int64_t{0});
  state.seed = meta.value("seed", uint64_t{0});
  return state;
}

}  // namespace megaplan::exec
