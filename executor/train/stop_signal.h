// Megatron's --exit-signal-handler: SIGTERM (what Slurm and torchrun send before they kill) and
// SIGINT only set a flag; the training loop reads it at the end of each iteration, all ranks agree
// on it, and the run then saves and exits (SIGTERM) or stops without saving (SIGINT). A second
// SIGINT kills at once, as without the handler.
#pragma once

namespace megaplan::exec {

enum class StopSignal : int { kNone = 0, kInterrupt = 1, kTerminate = 2 };

// Installs the handlers for this process (idempotent).
void install_stop_signal_handlers();

// The strongest signal received since the handlers were installed.
StopSignal received_stop_signal();

const char* signal_name(StopSignal signal);  // "SIGTERM", "SIGINT", "none"

}  // namespace megaplan::exec
