#include "executor/train/stop_signal.h"

#include <csignal>

namespace megaplan::exec {

namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void on_stop_signal(int number) {
  if (number == SIGTERM) {
    received = static_cast<int>(StopSignal::kTerminate);
  } else {
    if (received < static_cast<int>(StopSignal::kInterrupt)) received = static_cast<int>(StopSignal::kInterrupt);
    std::signal(SIGINT, SIG_DFL);  // the second Ctrl-C kills
  }
}

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

StopSignal received_stop_signal() { return static_cast<StopSignal>(static_cast<int>(received)); }

const char* signal_name(StopSignal signal) {
  switch (signal) {
    case StopSignal::kTerminate: return "SIGTERM";
    case StopSignal::kInterrupt: return "SIGINT";
    case StopSignal::kNone: break;
  }
  return "none";
}

}  // namespace megaplan::exec
