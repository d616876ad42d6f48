#!/usr/bin/env python3
"""How long a build measured here would take on more cores (docs/GPU.md, "The build's time").

    python3 tests/gpu/build_schedule.py BUILD_DIR [--cores 16] [--cpu-seconds S]

Reads the Ninja build's own record of every step (BUILD_DIR/.ninja_log: start and end of each
compile, archive and link) and replays it on --cores workers: each step as soon as what it waits
for is done and a worker is free, longest first. What waits for what, in this build:
  - a compile that uses the shared precompiled header (compile_commands.json: "-include
    .../cmake_pch.hxx") starts after that header is compiled; other compiles (GoogleTest's, the
    CUDA plugin's, the files that skip the header) start at once;
  - the static archives after every compile; the programs and shared libraries after the archives.
On a shared machine each step's wall time is stretched by the other work running beside it: with
--cpu-seconds (the build's measured user+sys CPU time), every step is scaled by the one factor
that makes their sum that CPU time, i.e. each step as it would take on a core of its own.
Python 3, standard library only.
"""
import argparse
import heapq
import json
import os
import sys


def read_log(build):
    steps = {}
    with open(os.path.join(build, ".ninja_log")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, _mtime, out, chash = line.rstrip("\n").split("\t")
            # A later run of the same output replaces an earlier one; several outputs of one
            # step share its times and hash.
            steps[out] = (int(start) / 1000.0, int(end) / 1000.0, chash)
    by_cmd = {}
    for out, (start, end, chash) in steps.items():
        by_cmd.setdefault((start, end, chash), []).append(out)
    return [(outs, end - start) for (start, end, _), outs in by_cmd.items()]


def pch_users(build):
    users = set()
    path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(path):
        return users
    for entry in json.load(open(path)):
        args = entry.get("command", "").split()
        if "-o" not in args or "-include" not in args:
            continue
        out = args[args.index("-o") + 1]
        if any(args[i - 1] == "-include" and "cmake_pch.hxx" in a for i, a in enumerate(args)):
            users.add(os.path.normpath(out))
    return users


def kind(outs, users):
    o = outs[0]
    if "cmake_pch.hxx.gch" in o:
        return "pch"
    if o.endswith(".o"):
        return "compile_pch" if os.path.normpath(o) in users else "compile"
    if o.endswith(".a"):
        return "archive"
    if o.startswith("bin/") or o.endswith(".so"):
        return "link"
    return "other"


def schedule(steps, cores):
    """Greedy list schedule, longest first among the ready; returns the makespan."""
    order = ["pch", "compile", "other", "compile_pch", "archive", "link"]
    waits_for = {"pch": [], "compile": [], "other": [], "compile_pch": ["pch"],
                 "archive": ["pch", "compile", "compile_pch", "other"],
                 "link": ["pch", "compile", "compile_pch", "other", "archive"]}
    done_at = {}
    free = [0.0] * cores
    heapq.heapify(free)
    for k in order:
        release = max([done_at.get(w, 0.0) for w in waits_for[k]] or [0.0])
        end_k = release
        for d in sorted((d for kk, d in steps if kk == k), reverse=True):
            t = heapq.heappop(free)
            start = max(t, release)
            heapq.heappush(free, start + d)
            end_k = max(end_k, start + d)
        done_at[k] = end_k
    return max(done_at.values()), done_at


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--cpu-seconds", type=float)
    a = ap.parse_args()
    users = pch_users(a.build)
    raw = read_log(a.build)
    steps = [(kind(outs, users), d) for outs, d in raw]
    total = sum(d for _, d in steps)
    scale = a.cpu_seconds / total if a.cpu_seconds else 1.0
    steps = [(k, d * scale) for k, d in steps]
    print(f"{len(steps)} steps, {total:.0f} s of step time in the log"
          + (f", scaled x {scale:.3f} to {a.cpu_seconds:.0f} CPU s" if a.cpu_seconds else ""))
    for k in ["pch", "compile", "compile_pch", "other", "archive", "link"]:
        ds = [d for kk, d in steps if kk == k]
        if ds:
            print(f"  {k:12s} {len(ds):4d} steps, {sum(ds):7.1f} s, longest {max(ds):6.1f} s")
    for cores in sorted({1, 2, a.cores}):
        span, _ = schedule(steps, cores)
        print(f"on {cores:2d} cores: {span:7.1f} s")


if __name__ == "__main__":
    sys.exit(main())
