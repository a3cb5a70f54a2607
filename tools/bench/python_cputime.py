"""Helper of tools/bench/python.sh: runs a peer's loader script and adds to each JSON line it
prints the CPU time its whole process tree spent since the previous line (or since the start):
"cpu_s" and "images_per_cpu_s". The peers print one line at the end of each pass, so the second
line's figure is the CPU of the second pass alone: the DataLoader's worker processes, FFCV's
threads and the consumer, without start-up, imports or (FFCV) numba compilation.

Tree CPU = user + system time (/proc/PID/stat utime, stime, cutime, cstime) summed over the
child and every live descendant, sampled when each line arrives.
Usage: python python_cputime.py CMD [ARG ...]
"""
import json
import os
import subprocess
import sys

TICK = os.sysconf("SC_CLK_TCK")


def stat_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    rest = text[text.rindex(")") + 2:].split()
    ppid = int(rest[1])
    cpu = sum(int(v) for v in rest[11:15])  # utime stime cutime cstime
    return ppid, cpu


def tree_cpu(root):
    """CPU seconds of `root` and its live descendants."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = stat_of(int(name))
            if s is not None:
                stats[int(name)] = s
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total / TICK


def main():
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
    last = tree_cpu(proc.pid)
    for line in proc.stdout:
        if not line.startswith("{"):
            sys.stdout.write(line)
            continue
        now = tree_cpu(proc.pid)
        row = json.loads(line)
        cpu, last = now - last, now
        row["cpu_s"] = cpu
        if row.get("images") and cpu > 0:
            row["images_per_cpu_s"] = row["images"] / cpu
        print(json.dumps(row), flush=True)
    sys.exit(proc.wait())


if __name__ == "__main__":
    main()
