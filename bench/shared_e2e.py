#!/usr/bin/env python3
"""Host-shared FULL_SHARD end to end: the gpt example against compute only,
NO_SHARD and PyTorch DDP on one host (issue 58's second method, beside
`BENCHES=bench_shared bash bench/run.sh`).

    python3 bench/shared_e2e.py [--build build] [--world 2,4] [--dtypes fp32,bf16] [--rounds 3]

Every configuration runs the gpt example (examples/gpt, GPT-mini d=256 L=6
h=4, batch 4 x 128 per rank, one compute thread per rank, FusedAdamW):
  compute   N plain runs of one rank each at once (`fsdp run -n 1`, NO_SHARD
            at world 1: no collective), the same per-rank batch: the step
            with the machine shared as the N ranks share it, and nothing
            to communicate
  full      `fsdp run -n N` FULL_SHARD (host-shared units where the ranks
            map each other's memory: FSDP_SHARE_HOST=auto)
  copying   the same with FSDP_SHARE_HOST=off (the cross-memory-attach path)
  none      `fsdp run -n N` NO_SHARD
  ddp       PyTorch DDP on the same model (bench/ddp_reference.py, its own
            timing: the median step, slowest rank), fp32 only
A configuration's step is (wall of LONG steps - wall of SHORT steps) /
(LONG - SHORT): start-up, data loading and the first steps cancel. Each
round runs every configuration once, in an order that rotates round by
round; each figure is the median over rounds. Run it on a quiet machine.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = [os.path.join(ROOT, "docs", f) for f in ("GUIDE.md", "DESIGN.md", "COMM.md", "RELIABILITY.md")]
MODEL = ["--dim", "256", "--layers", "6", "--heads", "4", "--seq", "128", "--batch", "4", "--threads", "1",
         "--eval-every", "0", "--no-progress", "--log-every", "1000"]


def gpt_cmd(a, n, steps, strategy, dtype):
    return [f"{a.build}/bin/fsdp", "run", "-n", str(n), "--", f"{a.build}/bin/gpt", "--text", *TEXT, *MODEL,
            "--strategy", strategy, "--dtype", dtype, "--steps", str(steps)]


def wall(cmds, env):
    """Seconds until every command (started at once) ended; exits on a failure."""
    t0 = time.monotonic()
    ps = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outs = [p.communicate()[0] for p in ps]
    t = time.monotonic() - t0
    for p, o, c in zip(ps, outs, cmds):
        if p.returncode:
            sys.exit(f"shared_e2e.py: {' '.join(c)} failed ({p.returncode}):\n{o[-3000:]}")
    return t


def step_s(a, config, n, dtype):
    env = dict(os.environ, FSDP_PROGRESS="off")
    if config == "compute":
        make = lambda steps: [gpt_cmd(a, 1, steps, "none", dtype) for _ in range(n)]
    else:
        strategy = {"full": "full", "copying": "full", "none": "none"}[config]
        if config == "copying":
            env["FSDP_SHARE_HOST"] = "off"
        make = lambda steps: [gpt_cmd(a, n, steps, strategy, dtype)]
    short, long_ = wall(make(a.short), env), wall(make(a.long), env)
    return (long_ - short) / (a.long - a.short)


def torch_python(build):
    """The build's Python with torch (FSDP_PYTHON in its CMake cache), as bench/run.sh finds it."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("FSDP_PYTHON:FILEPATH="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return sys.executable


def ddp_step_s(a, n):
    out = subprocess.run([torch_python(a.build), os.path.join(ROOT, "bench", "ddp_reference.py"), "--world", str(n), "--modes",
                          "ddp", "--steps", str(a.long - a.short)], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if "pytorch ddp" in line and " step " in line:
            return float(line.split(" step ")[1].split("ms")[0]) / 1e3
    sys.exit("shared_e2e.py: ddp_reference.py printed no step\n" + out.stdout[-2000:] + out.stderr[-2000:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--world", default="2,4")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--short", type=int, default=10)
    p.add_argument("--long", type=int, default=60)
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    with open("/proc/loadavg") as f:
        print(f"shared_e2e.py: load average before: {f.read().split()[0]}", flush=True)
    configs = ["compute", "full", "copying", "none"]
    res = {}
    for r in range(a.rounds):
        for n in (int(x) for x in a.world.split(",")):
            for dtype in a.dtypes.split(","):
                order = configs[r % len(configs):] + configs[:r % len(configs)]
                for c in order:
                    res.setdefault((n, dtype, c), []).append(step_s(a, c, n, dtype))
                if dtype == "fp32":
                    res.setdefault((n, dtype, "ddp"), []).append(ddp_step_s(a, n))
                row = ", ".join(f"{c} {res[(n, dtype, c)][-1] * 1e3:.1f}" for c in order + (["ddp"] if dtype == "fp32"
                                                                                             else []))
                print(f"round {r} N={n} {dtype}: {row} ms/step", flush=True)
    print(f"median over {a.rounds} rounds, ms per step (full/compute, full/ddp):")
    for (n, dtype) in sorted({(k[0], k[1]) for k in res}):
        m = {c: statistics.median(res[(n, dtype, c)]) for c in configs + ["ddp"] if (n, dtype, c) in res}
        ddp = f", DDP {m['ddp'] * 1e3:.1f}, full/DDP {m['full'] / m['ddp']:.3f}" if "ddp" in m else ""
        print(f"  N={n} {dtype}: compute {m['compute'] * 1e3:.1f}, FULL_SHARD {m['full'] * 1e3:.1f} "
              f"(copying {m['copying'] * 1e3:.1f}), NO_SHARD {m['none'] * 1e3:.1f}; full/compute "
              f"{m['full'] / m['compute']:.3f}{ddp}")


if __name__ == "__main__":
    main()
