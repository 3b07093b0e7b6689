#!/usr/bin/env bash
# Checkpoint speed on one GPU against what its disk does alone (issue 38). First the disk: 8 GiB
# written by dd in 16 MiB blocks with an fsync, from one stream and from four, then read back
# after dropping the page cache, from one stream and from four. Then bench/checkpoint_speed.sh:
# `megaplan train` of MODEL on the GPU saving twice (synchronous, then --async-save) and a run
# loading it, at THREADS --checkpoint-threads. Prints both tables; GB are 10^9 bytes.
#   bench/checkpoint_speed_device.sh MEGAPLAN_BINARY OUT_DIR [MODEL] [THREADS]
# MODEL: a preset (default gpt-1.3b, at sequence 1024); THREADS: default 8. OUT_DIR must lie on
# the disk measured, with room for 8 GiB (DISK_GIB) and one checkpoint (12 bytes per parameter), e.g.
#   bench/checkpoint_speed_device.sh build-cuda/cli/megaplan /tmp/ckpt gpt-1.3b 8
set -euo pipefail
megaplan=$1
out=$2
model=${3:-gpt-1.3b}
threads=${4:-8}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

gib=${DISK_GIB:-8}  # the disk test's size (DISK_GIB in the environment)
streams=4
drop_cache() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then echo cold; else echo warm; fi
}
# GB/s of `streams` dd processes running "$@" with their index substituted for {} (gib GiB in all).
timed_gbps() {
  local count=$1
  shift
  local start end
  start=$(date +%s.%N)
  for ((s = 0; s < count; s++)); do "${@//\{\}/$s}" 2> /dev/null & done
  wait
  end=$(date +%s.%N)
  python3 -c "print(f'{$gib * 2**30 / 1e9 / ($end - $start):.2f}')"
}
blocks=$((gib * 64))  # 16 MiB blocks
write1=$(timed_gbps 1 dd if=/dev/zero of="$out/disk{}.bin" bs=16M count=$blocks conv=fsync)
cache=$(drop_cache)
read1=$(timed_gbps 1 dd if="$out/disk{}.bin" of=/dev/null bs=16M)
rm -f "$out"/disk*.bin
write4=$(timed_gbps $streams dd if=/dev/zero of="$out/disk{}.bin" bs=16M count=$((blocks / streams)) conv=fsync)
drop_cache > /dev/null
read4=$(timed_gbps $streams dd if="$out/disk{}.bin" of=/dev/null bs=16M)
rm -f "$out"/disk*.bin
echo "disk ($(df --output=source "$out" | tail -1), $gib GiB, 16 MiB blocks; reads $cache)"
printf '%-8s%10s%10s\n' streams "write GB/s" "read GB/s"
printf '%-8s%10s%10s\n' 1 "$write1" "$read1" "$streams" "$write4" "$read4"
echo

"$here/checkpoint_speed.sh" "$megaplan" "$out" cuda "--model $model --seq-length 1024" "$threads"
