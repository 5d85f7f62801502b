"""CPU seconds per thread name of a job: runs the command, samples every thread of its Python descendants from /proc
(user and system time), prints the totals per name at the end (``main``: each process's main thread).

    python benchmarks/thread_cpu.py mpirun -np 4 ... python benchmarks/keras_example.py --sync allreduce ...
    python benchmarks/thread_cpu.py --per-rank --json out.json -- horovodrun ...   # per MPI rank, also as JSON

``--per-rank`` splits the totals by the rank Open MPI gave each process (``OMPI_COMM_WORLD_RANK``): on a slow node,
whatever the rank's other threads use comes out of the same CPU quota as its training (benchmarks/run.py
``--thread-cpu`` stores it with the run).

What docs/engine.md's "What the progress thread costs" was measured with (the engine's thread is named
``hetsync-engine``).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def descendants(root):
    """``root`` and every process below it (from each process's parent in /proc/<pid>/stat)."""
    kids = collections.defaultdict(list)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:  # it ended meanwhile
                continue
            kids[ppid].append(int(p))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids[p]
    return out


def rank_of(pid, ranks):
    """The MPI rank Open MPI gave the process (-1: none, e.g. the launcher's own Python), read from its environment
    once per process (``ranks``: the cache)."""
    if pid not in ranks:
        found = [item for item in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                 if item.startswith(b"OMPI_COMM_WORLD_RANK=")]
        ranks[pid] = int(found[0].split(b"=", 1)[1]) if found else -1
    return ranks[pid]


def sample(root, last, ranks):
    """Updates ``last[(pid, tid)] = (rank, name, user s, system s)`` for every thread of the Python processes below
    root."""
    for pid in descendants(root):
        try:
            if "python" not in open(f"/proc/{pid}/cmdline").read():
                continue
            rank = rank_of(pid, ranks)
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = "main" if tid == str(pid) else stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                last[(pid, tid)] = (rank, name, int(fields[11]) / HZ, int(fields[12]) / HZ)
        except OSError:  # the process or thread ended meanwhile: its last sample stands
            continue


def totals(last, per_rank):
    """{(rank or None, thread name): [user s, system s, threads]}."""
    out = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for rank, name, user, system in last.values():
        t = out[(rank if per_rank else None, name)]
        t[0] += user
        t[1] += system
        t[2] += 1
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-rank", action="store_true", help="totals per MPI rank and thread name")
    p.add_argument("--json", help="also write the totals to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the job's command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command to run")
    per_rank, json_out = args.per_rank, args.json
    last, ranks = {}, {}
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(proc.pid, last, ranks)
        time.sleep(0.3)
    # by rank, then the busiest thread first
    rows = sorted(totals(last, per_rank).items(), key=lambda kv: (kv[0][0] or 0, -(kv[1][0] + kv[1][1])))
    print("rank thread                user     sys  count", file=sys.stderr)
    for (rank, name), (user, system, count) in rows:
        if user + system > 0.2:
            print(f"{'' if rank is None else rank:>4} {name:20s} {user:7.1f} {system:7.1f} {count:5d}", file=sys.stderr)
    if json_out:
        with open(json_out, "w") as f:
            json.dump([{"rank": rank, "thread": name, "user_s": round(user, 2), "system_s": round(system, 2),
                        "threads": count} for (rank, name), (user, system, count) in rows], f, indent=1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
