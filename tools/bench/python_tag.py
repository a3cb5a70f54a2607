"""Helper of tools/bench/python.sh: reads a benchmark's output on stdin, finds every JSON object
in it (lines of several mpirun ranks may arrive glued together), adds KEY=VALUE fields and
prints one JSON line per object, or with --ranks one line for the whole job: total images /
slowest rank's seconds, mean per-step times, and the ranks' own lines under "per_rank".
With --last, only the last object is kept (a peer's last pass).
Usage: CMD | python python_tag.py [--ranks] [--last] [--filter KEY=VALUE] run=1 [peer=NAME ...]
"""
import json
import sys


def objects(text):
    dec = json.JSONDecoder()
    i = 0
    while True:
        j = text.find('{"', i)
        if j < 0:
            return
        try:
            obj, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        yield obj


def value(v):
    try:
        return json.loads(v)
    except ValueError:
        return v


def main():
    args = sys.argv[1:]
    ranks, last = "--ranks" in args, "--last" in args
    args = [a for a in args if a not in ("--ranks", "--last")]
    want = {}
    if "--filter" in args:
        i = args.index("--filter")
        k, v = args[i + 1].split("=", 1)
        want[k] = value(v)
        del args[i:i + 2]
    extra = {k: value(v) for k, v in (a.split("=", 1) for a in args)}
    rows = [o for o in objects(sys.stdin.read()) if all(o.get(k) == v for k, v in want.items())]
    if last:
        rows = rows[-1:]
    if ranks:
        if not rows:
            sys.exit("python_tag: no rank printed a result")
        steps = rows[0]["steps"]
        avg = lambda k: sum(r[k] for r in rows) / len(rows) / steps * 1e3  # noqa: E731
        images = sum(r["images"] for r in rows)
        seconds = max(r["seconds"] for r in rows)
        rows = [{"peer": rows[0]["peer"], "ranks": len(rows), "images": images,
                 "seconds": seconds, "images_per_s": images / seconds,
                 "data_ms_per_step": avg("data_s"), "fwd_bwd_ms_per_step": avg("fwd_bwd_s"),
                 "step_ms_per_step": avg("step_s"), "per_rank": rows}]
    for r in rows:
        print(json.dumps({**r, **extra}), flush=True)


if __name__ == "__main__":
    main()
