#!/usr/bin/env python3
"""Dumps torch.distributed.pipelining's per-rank action orders, the goldens megaplan's zb-h1, zbv
and dualpipev generators are tested against (tests/data/torch_schedules/).

torch computes every rank's order in `_calculate_single_rank_operations(self, rank)`, which reads
only a few attributes of the schedule; calling it on a namespace holding those avoids building
process groups and stages, so this runs on any machine with torch installed (no GPU needed).

Usage: torch_schedule_orders.py OUT_DIR
Writes OUT_DIR/orders.json ({"source": ..., "schedules": [{kind, pp, microbatches, ranks}]}, each
rank's actions as one space-separated string)
and torch-format CSVs (one row per rank, csv.writer, bubbles as empty cells) for a few shapes,
compute-only and, where torch's lowering pass is importable, with communication.
"""
import csv
import json
import os
import sys
from types import SimpleNamespace

import torch
from torch.distributed.pipelining import schedules as S


def zbv(pp, m, rank):
    ns = SimpleNamespace(pp_group_size=pp, _n_microbatches=m, num_stages=2 * pp, _num_stages=2 * pp)
    return S.ScheduleZBVZeroBubble._calculate_single_rank_operations(ns, rank)


def dualpipev(pp, m, rank):
    ns = SimpleNamespace(pp_group_size=pp, _n_microbatches=m, num_stages=2 * pp, _num_stages=2 * pp)
    return S.ScheduleDualPipeV._calculate_single_rank_operations(ns, rank)


def zb_h1(pp, m, rank):
    # ScheduleInterleavedZeroBubble with one local stage: the paper's ZB-H1 shape.
    rounds = max(1, m // pp)
    ns = SimpleNamespace(pp_group_size=pp, _n_microbatches=m, n_local_stages=1, microbatches_per_round=m // rounds)
    return S.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(ns, rank)


KINDS = {
    "zbv": (zbv, lambda pp, m: True),
    "dualpipev": (dualpipev, lambda pp, m: m >= 2 * pp),
    "zb-h1": (zb_h1, lambda pp, m: True),
}


def orders(kind, pp, m):
    fn, _ = KINDS[kind]
    return {rank: fn(pp, m, rank) for rank in range(pp)}


def text(order):
    return [str(a) for a in order if a is not None]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for rank in sorted(rows):
            w.writerow(rows[rank])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    result = {"source": f"torch.distributed.pipelining {torch.__version__}, tools/torch_schedule_orders.py",
              "schedules": []}
    for kind, (fn, ok) in KINDS.items():
        for pp in range(1, 9):
            for m in list(range(1, 25)) + [32]:
                if not ok(pp, m):
                    continue
                try:
                    o = orders(kind, pp, m)
                except Exception as e:  # record what torch refuses
                    result["schedules"].append({"kind": kind, "pp": pp, "microbatches": m, "error": repr(e)})
                    continue
                result["schedules"].append(
                    {"kind": kind, "pp": pp, "microbatches": m, "ranks": [" ".join(text(o[r])) for r in range(pp)]})
    with open(os.path.join(out, "orders.json"), "w") as f:
        f.write(json.dumps(result, separators=(",", ":")).replace("},{", "},\n{"))

    for kind, pp, m in [("zbv", 4, 8), ("dualpipev", 4, 10), ("zb-h1", 4, 8)]:
        o = orders(kind, pp, m)
        write_csv(os.path.join(out, f"{kind}-pp{pp}-m{m}.csv"), o)
        try:
            v = S.generate_stage_to_rank_mapping(pp, 2 * pp if kind != "zb-h1" else pp,
                                                 style="v" if kind != "zb-h1" else "loop")
            num_stages = 2 * pp if kind != "zb-h1" else pp
            cleaned = {r: [a for a in o[r] if a is not None] for r in o}
            comms = S._add_send_recv(cleaned, stage_to_rank=lambda s: v[s], num_stages=num_stages)
            write_csv(os.path.join(out, f"{kind}-pp{pp}-m{m}-comms.csv"), comms)
        except Exception as e:
            print(f"no comms CSV for {kind}: {e!r}")
    print(result["source"], "shapes", len(result["schedules"]))


if __name__ == "__main__":
    main()
