#!/usr/bin/env python3
"""How long megaplan's commands take as a user runs them, and how much memory they hold (issue 38).

Runs each command RUNS times and prints one table row per command: wall time (the fastest run and
the median), CPU time (user + system, median), peak resident memory (the largest of three more
runs, under GNU time), which of the GPU libraries the process loaded (CUDA, cuBLAS, cuBLASLt, NCCL,
MPI, the CUDA module) and issue 38's target. `devices` is the one GPU command here: it shows what
loading them costs a command that needs them (on a machine without a GPU it fails after loading
them, which is what it measures).

  usage: bench/command_speed.py MEGAPLAN_BINARY [--runs N]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

# (command, issue 38's target, the whole-process wall time and memory it must stay within)
COMMANDS = [
    (["presets"], "<= 30 ms, <= 80 MB"),
    (["groups", "--world-size", "16", "--tp", "4", "--pp", "2"], ""),
    (["schedule", "--kind", "zbv", "--pp", "4", "--microbatches", "8", "--lowered"], ""),
    (["describe", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "1024", "--tp", "8", "--pp", "16",
      "--gbs", "1536"], ""),
    (["simulate", "--model", "gpt2-124m", "--cluster", "h100-x1", "--gbs", "8"], ""),
    (["simulate", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--gpus", "3072", "--gbs", "3072", "--tp", "8",
      "--pp", "64"], "<= 50 ms"),
    (["search", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--gpus", "3072", "--gbs", "3072"], "<= 300 ms"),
    (["search", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--gpus", "8192"], "<= 500 MB"),
    (["search", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "16384", "--gbs", "2048",
      "--seq-length", "8192"], "<= 1 s"),
    (["devices"], ""),
]
TIME = "/usr/bin/time"  # GNU time (Debian's time package)
GPU_LIBRARIES = ("libcudart.so", "libcublas.so", "libcublasLt.so", "libnccl.so", "libmpi.so", "libmegaplan_cuda.so")


def run_once(binary, command):
    """(wall seconds, CPU seconds) of one run, started directly; its output is discarded."""
    to_null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    start = time.perf_counter()
    pid = os.posix_spawn(binary, [binary, *command], os.environ, file_actions=to_null)
    _, _, usage = os.wait4(pid, 0)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def peak_rss_kib(binary, command):
    """Peak resident memory of one run, as GNU time reports it: the high-water mark survives exec,
    so a process started from here would count this Python's own memory, one started by time
    counts time's few hundred KiB."""
    with tempfile.TemporaryDirectory() as scratch:
        rss_file = os.path.join(scratch, "rss")
        subprocess.run([TIME, "--format", "%M", "--output", rss_file, binary, *command], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        with open(rss_file, encoding="utf-8") as rss:
            return int(rss.read().split()[-1])


def gpu_libraries_loaded(binary, command):
    """The GPU libraries the dynamic loader initialised in one run (LD_DEBUG=libs)."""
    with tempfile.TemporaryDirectory() as log_dir:
        env = dict(os.environ, LD_DEBUG="libs", LD_DEBUG_OUTPUT=os.path.join(log_dir, "log"))
        subprocess.run([binary, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        initialised = set()
        for name in os.listdir(log_dir):
            with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as log:
                initialised.update(re.findall(r"calling init: \S*/(lib[^/\s]+?\.so)", log.read()))
    return [name for name in GPU_LIBRARIES if name in initialised]


def label(command):
    """The command with the values that tell its rows apart: the model, the GPUs, the layout."""
    values = dict(zip(command[1::2], command[2::2]))
    shown = [values[flag] for flag in ("--model", "--gpus") if flag in values]
    shown += [f"{flag[2:]} {values[flag]}" for flag in ("--tp", "--pp") if flag in values]
    return " ".join([command[0], *shown])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    rows = []
    for command, target in COMMANDS:
        run_once(binary, command)  # warms the page cache
        runs = [run_once(binary, command) for _ in range(args.runs)]
        walls = [wall for wall, _ in runs]
        loaded = gpu_libraries_loaded(binary, command)
        rows.append([
            label(command),
            f"{min(walls) * 1e3:.1f}",
            f"{statistics.median(walls) * 1e3:.1f}",
            f"{statistics.median(cpu for _, cpu in runs) * 1e3:.1f}",
            f"{max(peak_rss_kib(binary, command) for _ in range(3)) / 1024:.1f}",
            "all" if len(loaded) == len(GPU_LIBRARIES) else (" ".join(loaded) or "none"),
            target,
        ])
    header = ["command", "wall min ms", "wall median ms", "CPU median ms", "peak RSS MB", "GPU libraries", "target"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(f"{binary}, {args.runs} runs each")
    for row in [header, *rows]:
        print("  ".join(cell.ljust(widths[i]) if i == 0 or i == len(row) - 1 else cell.rjust(widths[i])
                        for i, cell in enumerate(row)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
