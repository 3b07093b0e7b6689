#!/usr/bin/env python3
"""Replaces a shipped measured profile's kernel tables with those of a newer full `megaplan profile`
run on one GPU of the same kind (a grid grown so widely that every table moved), keeping the link
tables (collectives, p2p, overlap) and the uncertainty of the shipped profile, which a single GPU
cannot measure: they came from `megaplan profile --links-only` on several GPUs. The provenance
becomes the new run's, with the links' origin and the reason kept beside it. Writes over BASE.
(bench/add_new_kernel_entries.py instead adds only the points the shipped profile lacks.)

  bench/join_link_tables.py BASE NEW "why the kernel tables were replaced"
"""
import sys

from shipped_profile import read_base_and_new, write_over

LINK_TABLES = ("collectives", "p2p", "overlap")


def main():
    base_path, base, new_path, new, reason = read_base_and_new("join_link_tables.py")
    for table in LINK_TABLES:
        if table in new:
            sys.exit(f"{new_path}: {table}: a single-GPU kernel profile was expected (it has link tables)")
        if table in base:
            new[table] = base[table]
    if "uncertainty" in base:
        new["uncertainty"] = base["uncertainty"]
    if "links" in base["provenance"]:
        new["provenance"]["links"] = base["provenance"]["links"]
    new["provenance"]["kernel_tables_replaced"] = (
        f"the kernel tables of {base['source']} replaced by this run's: {reason}")
    write_over(base_path, new)
    print(", ".join(f"{len(new[t])} {t}" for t in ("gemm", "attention", "kernels", *LINK_TABLES) if t in new))


if __name__ == "__main__":
    main()
