"""CPU seconds per thread name of a job: runs the command, samples every thread of its Python descendants from /proc
(user and system time), prints the totals per name at the end (``main``: each process's main thread).

    python benchmarks/thread_cpu.py mpirun -np 4 ... python benchmarks/keras_example.py --sync allreduce ...

What docs/engine.md's "What the progress thread costs" was measured with (the engine's thread is named
``hetsync-engine``).
"""
import collections
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


def sample(root, last):
    """Updates ``last[(pid, tid)] = (name, user s, system s)`` for every thread of the Python processes below root."""
    for pid in descendants(root):
        try:
            if "python" not in open(f"/proc/{pid}/cmdline").read():
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = "main" if tid == str(pid) else stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                last[(pid, tid)] = (name, int(fields[11]) / HZ, int(fields[12]) / HZ)
        except OSError:  # the process or thread ended meanwhile: its last sample stands
            continue


def main(argv):
    last = {}
    proc = subprocess.Popen(argv)
    while proc.poll() is None:
        sample(proc.pid, last)
        time.sleep(0.3)
    totals = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for name, user, system in last.values():
        t = totals[name]
        t[0] += user
        t[1] += system
        t[2] += 1
    print("thread                user     sys  count", file=sys.stderr)
    for name, (user, system, count) in sorted(totals.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        if user + system > 0.2:
            print(f"{name:20s} {user:7.1f} {system:7.1f} {count:5d}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
