#!/usr/bin/env python3
"""Checkpoints survive kill -9 at any point of a save.

1. Random points: a CPU training run that saves every iteration is killed with SIGKILL at a
   random moment, 24 times, each run resuming from the directory the last one left; then 8 times
   more with --async-save.
2. Before each system call of a save: strace's fault injection delivers SIGKILL at the entry of
   the k-th call of each kind a save makes (mkdir, openat, write, pwrite64, fchmod, fsync, close,
   rename, renameat2, unlink, unlinkat), for every such call from the save's first mkdir on — a
   save over an iteration saved before, whose old directory must give way without a moment when
   `latest` names nothing. Then the same with --async-save: the kills before the writer thread's
   calls (each block of model.bin it writes, its syncs) land while training goes on, mid-write.

After every kill the directory must hold a loadable newest checkpoint: a run with
--load DIR --save DIR loads it (or, before any save completed, starts from scratch), trains one
iteration, saves, and leaves no temporary file or staging directory behind.
Usage: kill_during_save_test.py MEGAPLAN EXAMPLES_DIR
"""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

megaplan, examples = sys.argv[1], sys.argv[2]
scratch = tempfile.mkdtemp(prefix="megaplan-kill-")
failures = []
LATEST = "latest_checkpointed_iteration.txt"
# LeakSanitizer cannot run under ptrace: a sanitizer build's leak check is off for strace's runs.
TRACED_ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
SAVE_SYSCALLS = ["mkdir", "openat", "write", "pwrite64", "fchmod", "fsync", "close", "rename", "renameat2", "unlink",
                 "unlinkat"]


def run(args, **kwargs):
    return subprocess.run([megaplan] + args, capture_output=True, text=True, **kwargs)


def train_args(directory, iterations, load=None, async_save=False):
    return ["train"] + (["--async-save"] if async_save else []) + [ "--device", "cpu", "--model", os.path.join(examples, "models/tiny-gpt.json"), "--vocab-size",
            "257", "--seq-length", "16", "--data-path", os.path.join(scratch, "corpus_text_document"), "--split", "1,0,0",
            "--mbs", "1", "--gbs", "2", "--log-interval", "1000", "--train-iters", str(iterations),
            "--load", load or directory, "--save", directory, "--save-interval", "1"]


def newest(directory):
    """The iteration a load picks: `latest`'s, or without it the newest complete iter_ directory (a
    kill between a save's rename and its `latest` leaves that save loadable, and newest)."""
    path = os.path.join(directory, LATEST)
    if os.path.exists(path):
        return int(open(path).read())
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return max((int(n[5:]) for n in names if re.fullmatch(r"iter_\d+", n)), default=0)


def check_recovers(directory, what, async_save=False):
    """The newest checkpoint loads, the run goes on one iteration and saves; nothing stale is left."""
    before = newest(directory)
    result = run(train_args(directory, before + 1, async_save=async_save))
    if result.returncode != 0:
        failures.append(f"{what}: resuming failed: {result.stderr.strip()}")
        return
    loaded = re.search(r"^loaded .* at iteration (\d+)$", result.stdout, re.M)
    if before > 0 and not loaded:
        failures.append(f"{what}: latest named {before} but the run did not load it: {result.stdout[:300]}")
    stale = sorted(n for n in os.listdir(directory) if n.endswith(".tmp") or ".tmp." in n)
    if stale:
        failures.append(f"{what}: stale files after the next save: {stale}")
    if newest(directory) != before + 1:
        failures.append(f"{what}: the next save did not become the newest ({newest(directory)}, want {before + 1})")


def main():
    random.seed(18)
    words = ["the", "cat", "a", "dog", "sees", "runs", "small", "old", "bird", "home"]
    with open(os.path.join(scratch, "docs.jsonl"), "w") as docs:
        for _ in range(20):
            docs.write('{"text": "%s"}\n' % " ".join(random.choice(words) for _ in range(50)))
    prepared = run(["data", "prepare", "--input", os.path.join(scratch, "docs.jsonl"), "--output-prefix",
                    os.path.join(scratch, "corpus"), "--append-eod"])
    assert prepared.returncode == 0, prepared.stderr

    # 1. Kills at random moments of runs that save every iteration.
    directory = os.path.join(scratch, "random")
    started = time.monotonic()
    full = run(train_args(os.path.join(scratch, "timing"), 6))
    assert full.returncode == 0, full.stderr
    duration = time.monotonic() - started
    for kill in range(32):
        async_save = kill >= 24
        process = subprocess.Popen([megaplan] + train_args(directory, newest(directory) + 6, async_save=async_save),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.05, 1.0) * duration)
        process.kill()
        process.wait()
        check_recovers(directory, f"random kill {kill + 1}" + (" (--async-save)" if async_save else ""), async_save)
    random_kills = 32

    # 2. A kill before each system call of a save (when strace can trace here).
    if subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True, env=TRACED_ENV).returncode != 0:
        print("kill_during_save: strace cannot trace here; the per-syscall kills were skipped", file=sys.stderr)
        return random_kills, 0
    # The killed run loads iteration 1 from one directory and saves iteration 2 into another whose
    # `latest` names its own iteration 2: the re-save of the iteration `latest` names, where the
    # old directory must give way with no moment at which `latest` names nothing.
    template = os.path.join(scratch, "template")
    assert run(train_args(template, 2)).returncode == 0
    start = os.path.join(scratch, "start")
    shutil.copytree(template, start)
    with open(os.path.join(start, LATEST), "w") as latest:
        latest.write("1\n")
    syscall_kills = 0
    for async_save in (False, True):
        syscall_kills += kill_before_each_call(template, start, async_save)
    return random_kills, syscall_kills


def kill_before_each_call(template, start, async_save):
    """Kills a run saving iteration 2 over `template` before each call of its save; returns how many."""
    label = " (--async-save)" if async_save else ""
    # With --async-save the run goes on to iteration 3 while iteration 2's files are written.
    iterations = 3 if async_save else 2
    log = os.path.join(scratch, "strace.log")
    # The run each kill interrupts, traced: the calls to kill before are its calls from the staging
    # directory's mkdir on.
    shutil.copytree(template, os.path.join(scratch, "traced"))
    traced = subprocess.run(["strace", "-f", "-o", log, "-e", "trace=" + ",".join(SAVE_SYSCALLS), megaplan]
                            + train_args(os.path.join(scratch, "traced"), iterations, load=start, async_save=async_save),
                            capture_output=True, text=True, env=TRACED_ENV)
    shutil.rmtree(os.path.join(scratch, "traced"))
    counts, targets, saving = {}, [], False
    for line in open(log):
        match = re.match(r"\d+\s+(\w+)\(", line)
        if not match or match.group(1) not in SAVE_SYSCALLS:
            continue
        kind = match.group(1)
        counts[kind] = counts.get(kind, 0) + 1
        saving = saving or (kind == "mkdir" and "iter_0000002.tmp" in line)
        if saving:
            targets.append((kind, counts[kind]))
    assert traced.returncode == 0 and targets, "the traced save made no calls: " + traced.stderr[-300:]
    for kind, occurrence in targets:
        directory = os.path.join(scratch, f"syscall-{kind}-{occurrence}")
        shutil.copytree(template, directory)
        subprocess.run(["strace", "-f", "-o", os.devnull, "-e", "trace=" + kind, "-e",
                        f"inject={kind}:signal=KILL:when={occurrence}", megaplan]
                       + train_args(directory, iterations, load=start, async_save=async_save), capture_output=True,
                       env=TRACED_ENV)
        check_recovers(directory, f"kill before {kind} #{occurrence}{label}", async_save)
        shutil.rmtree(directory)
    return len(targets)




try:
    random_kills, syscall_kills = main()
finally:
    shutil.rmtree(scratch, ignore_errors=True)
for failure in failures:
    print("FAIL: " + failure, file=sys.stderr)
if failures:
    sys.exit(1)
print(f"kill_during_save: {random_kills} random kills and {syscall_kills} kills before a save's system calls; "
      "every checkpoint directory recovered")
