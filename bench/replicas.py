#!/usr/bin/env python3
"""Replica groups that come and go (fsdp/replicas.h): the goals of per-step
fault tolerance, measured with GPT-mini on this machine.

  python3 bench/replicas.py heal      [--build build]   heal of make scale's 85.7 M model vs loading it
  python3 bench/replicas.py overhead  [--build build]   step time: 2 groups x 2 ranks vs HYBRID_SHARD, 4 ranks
                                      [--group-ranks 1]  2 groups x 1 rank vs HYBRID_SHARD of 2 x 1
  python3 bench/replicas.py failures  [--build build]   3 groups, 200 steps, a rank killed every 20 steps
  python3 bench/replicas.py chaos     [--build build]   3 groups, 300 steps, a fault of any kind every ~20 steps

Each prints what it measured and the commands it ran; nothing is kept
(every run is in a temporary directory) unless --keep DIR names a folder for
the logs (the coordinator's lives and each group's), to read a run that
missed a goal. Run it on a quiet machine.
"""
import argparse
import contextlib
import glob
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = [os.path.join(ROOT, "docs", f) for f in ("GUIDE.md", "DESIGN.md", "COMM.md", "RELIABILITY.md")]
SCALE = ["--dim", "768", "--layers", "12", "--heads", "12", "--seq", "256", "--batch", "1", "--ac", "block"]
SMALL = ["--dim", "256", "--layers", "4", "--heads", "8", "--seq", "128", "--batch", "8"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Coordinator:
    def __init__(self, build, work, timeout_s=10.0, min_groups=1):
        self.port = free_port()
        self.work = work
        self.lives = 0
        self.logs = []
        self.cmd = [f"{build}/bin/fsdp", "coordinator", "--port", str(self.port), "--heartbeat-timeout",
                    str(timeout_s), "--min-groups", str(min_groups)]
        self.start()

    def start(self):
        """Starts it (again: on the same port, after kill())."""
        self.lives += 1
        self.log = os.path.join(self.work, f"coordinator-{self.lives}.log")
        self.logs.append(self.log)
        self.p = subprocess.Popen(self.cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    transport = "auto"

    def env(self, group):
        e = dict(os.environ)
        e["FSDP_TRANSPORT"] = Coordinator.transport
        e.update({"FSDP_COORDINATOR": f"127.0.0.1:{self.port}", "FSDP_REPLICA_GROUP": str(group),
                  "FSDP_PROGRESS": "off"})
        return e

    def text(self):
        return "".join(open(f).read() for f in self.logs)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait()
        return self.text()


def group_cmd(build, n, gpt_args, restarts=0):
    return [f"{build}/bin/fsdp", "run", "-n", str(n), "--max-restarts", str(restarts), "--",
            f"{build}/bin/gpt", "--text", *TEXT, "--eval-every", "0", "--no-progress", *gpt_args]


def wait_for(pred, timeout_s, what):
    t0 = time.time()
    while not pred():
        if time.time() - t0 > timeout_s:
            sys.exit(f"replicas.py: gave up waiting for {what} after {timeout_s} s")
        time.sleep(0.05)


def heal(a):
    with tempfile.TemporaryDirectory() as work:
        c = Coordinator(a.build, work, timeout_s=60)
        ckpt = os.path.join(work, "ckpt")
        common = [*SCALE, "--threads", "1", "--lr", "3e-4", "--warmup", "0", "--log-every", "1", "--replicas", "2"]
        g0 = group_cmd(a.build, 2, [*common, "--steps", "12", "--ckpt-dir", ckpt, "--ckpt-every", "2"])
        g1 = group_cmd(a.build, 2, [*common, "--steps", "12"])
        log0, log1 = os.path.join(work, "g0.log"), os.path.join(work, "g1.log")
        p0 = subprocess.Popen(g0, env=c.env(0), stdout=open(log0, "w"), stderr=subprocess.STDOUT)
        # Group 1 starts once group 0 committed its checkpoint at step 2.
        wait_for(lambda: os.path.exists(os.path.join(ckpt, "latest")), 1800, "group 0's checkpoint at step 2")
        p1 = subprocess.Popen(g1, env=c.env(1), stdout=open(log1, "w"), stderr=subprocess.STDOUT)
        p0.wait()
        p1.wait()
        coord = c.stop()
        out1 = open(log1).read()
        m = re.search(r"replica group 1 healed from group 0 at step (\d+): ([\d.]+) MB in ([\d.]+) s "
                      r"\(rank 0; before it ([\d.]+) s waiting", out1)
        if p0.returncode or p1.returncode or not m:
            sys.exit("replicas.py heal: a group failed or never healed\n" + open(log0).read()[-3000:] + out1[-3000:] +
                     coord)
        # The same state from the sharded checkpoint, at the same world size.
        load = subprocess.run(group_cmd(a.build, 2, [*SCALE, "--threads", "1", "--lr", "3e-4", "--warmup", "0",
                                                     "--ckpt-dir", ckpt, "--resume", "--steps", "13"]),
                              capture_output=True, text=True, env={**os.environ, "FSDP_TRANSPORT": a.transport})
        lm = re.search(r"loaded the checkpoint: ([\d.]+) MB in ([\d.]+) s", load.stdout + load.stderr)
        if not lm:
            sys.exit("replicas.py heal: the resume printed no load time\n" + (load.stdout + load.stderr)[-3000:])
        print(f"heal of the 85.7 M model (2 ranks per group), rank 0: {m.group(2)} MB in {m.group(3)} s at step "
              f"{m.group(1)}, from the source's first byte (before it {m.group(4)} s waiting for the source to "
              f"finish its previous step)")
        print(f"load of the same state from a sharded checkpoint (page cache warm), rank 0: {lm.group(1)} MB in "
              f"{lm.group(2)} s")
        print(f"heal / load = {float(m.group(3)) / float(lm.group(2)):.2f}")
        print("coordinator:\n" + coord)


def step_ms(text):
    return [float(x) for x in re.findall(r"\|\s+([\d.]+) ms/step", text)]


def overhead(a):
    """Both configurations in every round, their order alternating (the one that runs second does not
    always inherit the first one's warm caches or its tail of load); the result is the median of the
    rounds' ratios, each round's ratio taken between runs seconds apart."""
    steps = str(a.steps)
    n = a.group_ranks
    # Both configurations run 2 x n ranks on this host: the same intra-op threads each, so that no
    # configuration oversubscribes the cores (a group's ranks count only their own group's ranks).
    threads = ["--threads", str(max(1, (os.cpu_count() or 1) // (2 * n)))]
    rounds = []

    def hybrid(work):
        # HYBRID_SHARD: one job of 2 x n ranks, shard groups of n (traced too, as the groups are).
        h = subprocess.run(group_cmd(a.build, 2 * n, [*SMALL, *threads, "--strategy", "hybrid", "--shard-group", str(n),
                                                  "--steps", steps, "--log-every", "1",
                                                  "--trace", os.path.join(work, "trace-hybrid")]),
                           capture_output=True, text=True, env={**os.environ, "FSDP_TRANSPORT": a.transport})
        if h.returncode or not step_ms(h.stdout)[2:]:
            sys.exit("replicas.py overhead: HYBRID_SHARD failed or printed no step times\n" + h.stdout[-3000:])
        return statistics.median(step_ms(h.stdout)[2:])

    def groups(work):
        # The same as two replica groups of n ranks (FULL_SHARD inside), traced: the protocol's own
        # waits (spans quorum and vote) are read from the trace.
        c = Coordinator(a.build, work, timeout_s=30, min_groups=2)
        trace = os.path.join(work, "trace")
        ps = [subprocess.Popen(group_cmd(a.build, n, [*SMALL, *threads, "--strategy", "full", "--steps", steps,
                                                      "--log-every", "1", "--replicas", "2", "--trace", trace]),
                               env=c.env(g), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for g in (0, 1)]
        outs = [p.communicate()[0] for p in ps]
        c.stop()
        if any(p.returncode for p in ps) or not step_ms(outs[0])[2:]:
            sys.exit("replicas.py overhead: a replica group failed or printed no step times\n" + outs[0][-3000:])
        waits.append(protocol_waits(trace))
        return statistics.median(step_ms(outs[0])[2:])

    waits = []

    for r in range(a.rounds):
        with tempfile.TemporaryDirectory() as work:
            if r % 2 == 0:
                h = hybrid(work)
                f = groups(work)
            else:
                f = groups(work)
                h = hybrid(work)
        rounds.append((h, f))
        print(f"round {r}: HYBRID_SHARD {h:.1f} ms/step, replica groups {f:.1f} ms/step, ratio {f / h:.3f}"
              f"{' (groups first)' if r % 2 else ''}", flush=True)
    hy = statistics.median(x for x, _ in rounds)
    ft = statistics.median(y for _, y in rounds)
    ratio = statistics.median(y / x for x, y in rounds)
    print(f"median over {a.rounds} rounds: HYBRID_SHARD {hy:.1f} ms/step, replica groups {ft:.1f} ms/step; "
          f"median of the rounds' ratios {ratio:.3f}")
    q = statistics.median(w["quorum"] for w in waits)
    v = statistics.median(w["vote"] for w in waits)
    print(f"the protocol's own waits per step (every rank's median, median over rounds): quorum {q:.2f} ms, "
          f"vote {v:.2f} ms; together {(q + v) / ft * 100:.2f} % of the replica groups' step")


def protocol_waits(trace):
    """The median duration in ms of the spans `quorum` and `vote` over the steps after the first two,
    the median over every rank's trace under `trace`. A span missing from a rank's trace is an error."""
    per = {"quorum": [], "vote": []}
    files = []
    for g in glob.glob(os.path.join(trace, "group*")):  # each rank's file; a group of one may have only trace.json
        files += glob.glob(os.path.join(g, "trace-rank*.json")) or glob.glob(os.path.join(g, "trace.json"))
    if not files:
        sys.exit(f"replicas.py overhead: no rank trace under {trace}")
    for f in files:
        ev = json.load(open(f))
        ev = ev.get("traceEvents", []) if isinstance(ev, dict) else ev
        for name in per:
            d = [e["dur"] / 1000 for e in ev if e.get("ph") == "X" and e.get("name") == name]
            if len(d) < 3:
                sys.exit(f"replicas.py overhead: {f} has {len(d)} spans {name!r}, expected one per step")
            per[name].append(statistics.median(d[2:]))
    return {k: statistics.median(v) for k, v in per.items()}


def pid_of(build, group, rank):
    """The pid of gpt rank `rank` of replica group `group` (its environment says which)."""
    pids = subprocess.run(["pgrep", "-f", f"{build}/bin/gpt"], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"FSDP_REPLICA_GROUP={group}".encode() in env and f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def start_groups(a, c, work, steps, restarts):
    """3 groups of 2 ranks (GPT-mini SMALL, --log-every 1): their processes, log files, stamped lines
    (each line with the time it arrived) and the threads that read them."""
    logs = [os.path.join(work, f"g{g}.log") for g in range(3)]
    cmd = [*SMALL, "--strategy", "full", "--steps", str(steps), "--log-every", "1", "--replicas", "3"]
    ps = [subprocess.Popen(group_cmd(a.build, 2, cmd, restarts=restarts), env=c.env(g),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for g in range(3)]
    stamped = [[] for _ in range(3)]

    def copy(g):
        with open(logs[g], "w") as f:
            for line in ps[g].stdout:
                stamped[g].append((time.monotonic(), line))
                f.write(line)
                f.flush()
    readers = [threading.Thread(target=copy, args=(g,)) for g in range(3)]
    for t in readers:
        t.start()
    return ps, logs, stamped, readers


def failures(a):
    steps, every = a.steps, 20
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as work:
        c = Coordinator(a.build, work, timeout_s=a.timeout, min_groups=3)
        ps, logs, stamped, readers = start_groups(a, c, work, steps, steps // every + 1)
        kills = []
        for k in range(every, steps, every):
            # Once the job reached step k, kill rank 0 or 1 of a random group.
            def reached():
                done = re.findall(r"step\s+(\d+) \| quorum \d+: groups [\d,]+ committed", open(logs[0]).read())
                return bool(done) and int(done[-1]) >= k
            wait_for(reached, 600, f"step {k}")
            g, r = rng.randrange(3), rng.randrange(2)
            pid = pid_of(a.build, g, r)
            if pid:
                os.kill(pid, signal.SIGKILL)
                kills.append((k, g, r))
        for p in ps:
            p.wait()
        for t in readers:
            t.join()
        coord = c.stop()
        # (group, step) pairs of the live groups: a step committed with the
        # group in its quorum counts; a group's restart and heal are not live.
        committed = {}
        for g in range(3):
            for m in re.finditer(r"step\s+(\d+) \| quorum \d+: groups ([\d,]+) committed", open(logs[g]).read()):
                committed[int(m.group(1))] = [int(x) for x in m.group(2).split(",")]
        pairs = sum(len(v) for v in committed.values())
        print(f"{len(kills)} kills (step, group, rank): {kills}")
        print(f"steps committed: {len(committed)} of {steps}; (group, step) pairs committed: {pairs} of {3 * steps} "
              f"({100.0 * pairs / (3 * steps):.1f}%)")
        # The longest a group that was not killed waited between two of its
        # committed steps, against the heartbeat timeout + its median step.
        killed_at = {(k, g) for k, g, _ in kills}
        worst = (0.0, None)
        gaps_all = []
        for g in range(3):
            times = [(t, int(m.group(1))) for t, line in stamped[g]
                     for m in [re.search(r"step\s+(\d+) \| quorum \d+: groups [\d,]+ committed", line)] if m]
            gaps = [(t1 - t0, s1) for (t0, _), (t1, s1) in zip(times, times[1:])]
            gaps_all += [d for d, _ in gaps]
            for d, s1 in gaps:
                # a gap of the killed group itself (its restart) is not a survivor's wait
                if any(g == kg and k <= s1 <= k + every for k, kg in killed_at):
                    continue
                if d > worst[0]:
                    worst = (d, (g, s1))
        median_step = statistics.median(gaps_all) if gaps_all else 0.0
        print(f"longest wait of a surviving group between two committed steps: {worst[0]:.2f} s "
              f"(group {worst[1][0] if worst[1] else '-'}, before step {worst[1][1] if worst[1] else '-'}); "
              f"heartbeat timeout {a.timeout:.1f} s + median step {median_step:.2f} s = {a.timeout + median_step:.2f} s")
        drops = coord.count(") dropped: ")
        print(f"steps dropped: {drops}; the coordinator's log: {c.log} (removed with the run)")
        print(coord)


def chaos(a):
    """3 groups of 2 ranks over --steps steps; about every 20 steps a fault drawn from --seed: a rank killed,
    a group's host lost (both ranks), a rank stopped for 1.5 x the heartbeat timeout, a source killed as a
    heal starts, the coordinator killed and started again at once."""
    steps, every = a.steps, 20
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as work:
        c = Coordinator(a.build, work, timeout_s=a.timeout, min_groups=3)
        ps, logs, stamped, readers = start_groups(a, c, work, steps, steps // 10)
        committed_re = re.compile(r"step\s+(\d+) \| quorum \d+: groups [\d,]+ committed")

        def progress():
            most = -1
            for g in range(3):
                for _, line in list(stamped[g]):
                    m = committed_re.search(line)
                    if m:
                        most = max(most, int(m.group(1)))
            return most
        faults, down = [], []  # down: (group, the time it went down)
        restarts_at = []       # (time, step) of each coordinator restart
        fault_at = []          # (start, end, kind, step, the groups it hit) of each fault
        k = every
        while k < steps - every:
            wait_for(lambda: progress() >= k or all(p.poll() is not None for p in ps), 900, f"step {k}")
            what = rng.choice(["kill", "host", "stop", "heal", "coordinator"])
            g, r = rng.randrange(3), rng.randrange(2)
            t = time.monotonic()
            if what == "kill" and pid_of(a.build, g, r):
                os.kill(pid_of(a.build, g, r), signal.SIGKILL)
                down.append((g, t))
            elif what == "host":
                for rr in range(2):
                    if pid_of(a.build, g, rr):
                        os.kill(pid_of(a.build, g, rr), signal.SIGKILL)
                down.append((g, t))
            elif what == "stop" and pid_of(a.build, g, r):
                pid = pid_of(a.build, g, r)
                os.kill(pid, signal.SIGSTOP)
                time.sleep(1.5 * a.timeout)
                os.kill(pid, signal.SIGCONT)
                down.append((g, t))
            elif what == "heal" and pid_of(a.build, g, r):
                before = c.text().count(f"healing {g} from")
                sources = [s for s in range(3) if s != g]
                src_pids = {s: pid_of(a.build, s, r) for s in sources}
                os.kill(pid_of(a.build, g, r), signal.SIGKILL)
                down.append((g, t))
                t0 = time.monotonic()
                while c.text().count(f"healing {g} from") <= before and time.monotonic() - t0 < 60:
                    time.sleep(0.001)
                line = [l for l in c.text().splitlines() if f"healing {g} from" in l][-1:]
                if line:
                    sources = [int(x) for x in line[0].split(" from ")[1].split(",")]
                    src = sources[r % len(sources)]  # shard r heals from source r mod #sources
                    if src_pids.get(src):
                        os.kill(src_pids[src], signal.SIGKILL)
                        down.append((src, time.monotonic()))
            elif what == "coordinator":
                c.kill()
                c.start()
                restarts_at.append((time.monotonic(), progress()))
            faults.append((k, what, g, r))
            fault_at.append((t, time.monotonic(), what, k, {hg for hg, th in down if th >= t}))
            k += rng.randrange(15, 26)
        for p in ps:
            p.wait()
        for t in readers:
            t.join()
        coord = c.stop()
        committed = {}
        for g in range(3):
            for m in committed_re.finditer(open(logs[g]).read()):
                committed[int(m.group(1))] = [int(x) for x in re.search(
                    r"groups ([\d,]+) committed", m.group(0)).group(1).split(",")]
        pairs = sum(len(v) for v in committed.values())
        # Live pairs: a group is not live from its fault until its first committed step after it.
        times = {g: [(t, int(m.group(1))) for t, line in stamped[g] for m in [committed_re.search(line)] if m]
                 for g in range(3)}
        dead_steps = 0
        for g, t_down in down:
            after = [s for t, s in times[g] if t > t_down]
            before = [s for t, s in times[g] if t <= t_down]
            if after and before:
                dead_steps += max(0, after[0] - before[-1] - 1)
        live = 3 * steps - dead_steps
        print(f"{len(faults)} faults (step, kind, group, rank): {faults}")
        print(f"steps committed: {len(committed)} of {steps}; (group, step) pairs committed: {pairs} of {3 * steps} "
              f"({100.0 * pairs / (3 * steps):.1f}%); of the live groups' {live} pairs: {100.0 * pairs / live:.1f}%")
        gaps_all, worst = [], (0.0, None)
        hit = [(g, t) for g, t in down]
        for g in range(3):
            ts = times[g]
            for (t0, _), (t1, s1) in zip(ts, ts[1:]):
                gaps_all.append(t1 - t0)
                # a gap of a group that was hit in it (its own restart, its stop) is not a survivor's wait
                if any(hg == g and t0 - 1 <= th <= t1 for hg, th in hit):
                    continue
                if t1 - t0 > worst[0]:
                    worst = (t1 - t0, (g, s1))
        median_step = statistics.median(gaps_all) if gaps_all else 0.0
        print(f"longest wait of a group no fault hit, between two committed steps: {worst[0]:.2f} s "
              f"(group {worst[1][0] if worst[1] else '-'}, before step {worst[1][1] if worst[1] else '-'}); "
              f"heartbeat timeout {a.timeout:.1f} s + median step {median_step:.2f} s = {a.timeout + median_step:.2f} s")
        # Each fault: the longest gap between two committed steps of a group it did not hit, among the gaps that
        # overlap the fault (from its first kill to its last).
        for t_f, t_e, what, k_f, hit_f in fault_at:
            spans = [(t1 - t0, g) for g in range(3) if g not in hit_f
                     for (t0, _), (t1, _) in zip(times[g], times[g][1:]) if t0 <= t_e and t1 >= t_f]
            gap, g = max(spans, default=(0.0, None))
            print(f"fault at step {k_f} ({what}, hit {sorted(hit_f) or '-'}): the longest gap of a group it did not "
                  f"hit: {gap:.2f} s (group {g if g is not None else '-'}) = heartbeat timeout + "
                  f"{(gap - a.timeout) / max(median_step, 1e-9):.1f} median steps")
        for t_r, s_r in restarts_at:
            # what the restart cost: steps dropped from it to the next step every group committed, and the longest
            # gap of any group across it
            drops = [int(m.group(1)) for g in range(3) for tt, line in stamped[g] if tt >= t_r
                     for m in [re.search(r"step\s+(\d+) \| quorum \d+: groups [\d,]+ dropped", line)] if m]
            near = [d for d in drops if d <= s_r + 5]
            gap = max((t1 - t0 for g in range(3) for (t0, _), (t1, _) in zip(times[g], times[g][1:])
                       if t0 <= t_r <= t1), default=0.0)
            print(f"coordinator restart at step {s_r}: {len(set(near))} step(s) dropped around it; the longest any "
                  f"group waited across it: {gap:.2f} s (median step {median_step:.2f} s: "
                  f"{gap / max(median_step, 1e-9):.1f} steps)")
        print(f"steps dropped: {coord.count(') dropped: ')}; coordinator restarts: {len(restarts_at)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["heal", "overhead", "failures", "chaos"])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--group-ranks", type=int, default=2,
                   help="overhead: ranks per group (2: 4 ranks in all; 1: 2 ranks, one per core on a 2-core host)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3.0, help="the coordinator's heartbeat timeout (failures)")
    p.add_argument("--keep", default=None, help="keep every run's logs in this new folder (default: none kept)")
    p.add_argument("--transport", default="auto", choices=["auto", "tcp", "cma"],
                   help="FSDP_TRANSPORT of every run (tcp: the groups' links as between hosts)")
    a = p.parse_args()
    if a.keep:
        # Every run's work folder under KEEP, left there (the logs of a run that missed a goal).
        os.makedirs(a.keep)
        keep_in = os.path.abspath(a.keep)

        @contextlib.contextmanager
        def kept():
            d = tempfile.mkdtemp(dir=keep_in)
            print(f"logs kept in {d}", flush=True)
            yield d

        tempfile.TemporaryDirectory = kept
    Coordinator.transport = a.transport
    a.build = os.path.abspath(a.build)
    if a.steps is None:
        a.steps = {"heal": 4, "overhead": 30, "failures": 200, "chaos": 300}[a.what]
    {"heal": heal, "overhead": overhead, "failures": failures, "chaos": chaos}[a.what](a)


if __name__ == "__main__":
    main()
