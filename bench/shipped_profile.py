"""What the scripts that update a shipped measured profile share: reading the shipped profile
(BASE) and a newer `megaplan profile` run (NEW) of the same GPU from the command line, and writing
the result over BASE atomically, in the shipped files' form (sorted keys, two-space indent)."""
import json
import os
import sys


def read_base_and_new(script):
    """BASE, NEW and REASON from argv: (base_path, base, new_path, new, reason); exits on misuse."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {script} BASE NEW REASON")
    base_path, new_path, reason = sys.argv[1:]
    base = json.load(open(base_path))
    new = json.load(open(new_path))
    if base.get("gpu") != new.get("gpu"):
        sys.exit(f"{new_path}: gpu: {new.get('gpu')!r} is not the base profile's {base.get('gpu')!r}")
    return base_path, base, new_path, new, reason


def write_over(base_path, profile):
    temporary = base_path + ".tmp"
    with open(temporary, "w") as out:
        json.dump(profile, out, indent=2, sort_keys=True)
        out.write("\n")
    os.replace(temporary, base_path)
