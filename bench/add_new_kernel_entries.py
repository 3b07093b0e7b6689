#!/usr/bin/env python3
"""Adds to a shipped measured profile the kernel entries a newer `megaplan profile` run timed at
points the shipped one lacks (a grid grown by new cells), keeping every entry the shipped profile
already has: those were validated against training (docs/results.md), and a new run's entries at
the same points differ only by the profile's run-to-run spread. Writes the result over BASE.

  bench/add_new_kernel_entries.py BASE NEW "why the grid grew"
"""
from shipped_profile import read_base_and_new, write_over

KEYS = {
    "gemm": ("m", "n", "k", "dtype", "layout", "epilogue"),
    "attention": ("batch_heads", "seq", "head_dim", "gqa_ratio", "causal", "dropout", "ring_block"),
    "kernels": ("kernel", "bytes"),
}
# Optional fields as the loader reads them when absent (profiles/README.md).
DEFAULTS = {"gqa_ratio": 1, "dropout": False, "ring_block": False, "layout": "forward", "epilogue": "none"}


def main():
    base_path, base, _, new, reason = read_base_and_new("add_new_kernel_entries.py")
    added = {}
    for table, fields in KEYS.items():
        have = {tuple(entry.get(f, DEFAULTS.get(f)) for f in fields) for entry in base[table]}
        fresh = [entry for entry in new[table] if tuple(entry.get(f, DEFAULTS.get(f)) for f in fields) not in have]
        base[table].extend(fresh)
        added[table] = len(fresh)
    counts = ", ".join(f"{count} {table}" for table, count in added.items())
    note = (f"{counts} entries at points this profile lacked, from {new['provenance'].get('command')} on "
            f"{new['provenance'].get('device')}, {new['provenance'].get('date')}: {reason}")
    earlier = base["provenance"].get("added_kernel_entries")
    base["provenance"]["added_kernel_entries"] = f"{earlier}; then {note}" if earlier else note
    write_over(base_path, base)
    print(counts)


if __name__ == "__main__":
    main()
