// What `megaplan launch` does: starts one node's ranks as torchrun does — N copies of this binary running the
// command after `--`, each with torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT — and supervises them: one failing rank stops the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace megaplan::exec {

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::optional<std::string> master_addr;  // required with nnodes > 1; else 127.0.0.1
  int64_t master_port = 29500;
  std::vector<std::string> command;  // the arguments after `--`, e.g. {"train", "--plan", "job.json"}
  // How long ranks get between SIGTERM and SIGKILL once one failed. Not a flag; tests shorten it.
  std::chrono::milliseconds stop_grace{5000};
  // The GPUs this node shows (nullopt: count_visible_gpus()). Not a flag; tests set it.
  std::optional<int64_t> visible_gpus;
};

// The GPUs a rank of this node can use, counted without loading CUDA (the launcher must not hold
// a context on the devices its ranks train on): the NVIDIA device nodes /dev/nvidiaN, at most as
// many as CUDA_VISIBLE_DEVICES lists where it is set. `devices`: where the device nodes lie.
int64_t count_visible_gpus(const std::string& devices = "/dev");

// Throws SpecError naming the flag: nproc-per-node and nnodes >= 1, 0 <= node-rank < nnodes,
// master-port in 1..65535, a command after `--`, --master-addr with more than one node; the ranks
// within core's input limits (kMaxGpusPerNode a node, kMaxWorldSize in all), and no more ranks of
// a GPU command (train, --device cuda being its default, and profile) than the node has GPUs.
void validate_launch_options(const LaunchOptions& options);

// Runs `program` with options.command as its arguments, once per local rank, in an environment
// without any launcher's rank variables (launch_environment_variables()) plus torchrun's for the
// rank; NCCL_NVLS_ENABLE=0 unless the caller set it. stdin and stdout are inherited (training logs
// are rank 0's stdout). Each rank's stderr comes through a pipe and goes to `err` in whole lines,
// in the order they arrive, so that lines of ranks writing at once never cut into each other: a
// last line without a newline gets one when the rank's stderr closes, a line longer than 1 MiB goes
// in 1 MiB pieces, and an error line (`megaplan: error: ...`) identical to one already forwarded
// from another rank is dropped, so ranks failing the same check show it once, as is a last line
// without a newline that is the start of one (the same error, its rank stopped halfway through
// writing it); other lines are all forwarded. What a process a rank left behind writes to it after
// the last rank exited is not. Waits for every child. When one exits non-zero or by a signal,
// writes to `err` the lines its stderr held, then one line naming that rank and its status, sends
// SIGTERM to the rest, SIGKILL after options.stop_grace, reaps them all, and returns the failure's
// exit code (128 + signal for a signal). SIGINT and SIGTERM sent to this process are forwarded to
// the children; one that arrives while the ranks are being started stops the starting, and the
// ones started are stopped and reaped as after a failure (the exit code 128 + the signal). Returns 0 when every rank
// exits 0. Throws what validate_launch_options throws, and SpecError(program, ...) when a rank cannot be started (the
// ones already running are killed and reaped first). Signals are taken through a signalfd in the calling thread: other
// threads of the process should block SIGINT and SIGTERM, or one may take a signal meant for forwarding.
int run_launch(const LaunchOptions& options, const std::string& program, std::ostream& err);

}  // namespace megaplan::exec
