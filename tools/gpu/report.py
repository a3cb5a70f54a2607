"""The results of tools/gpu/run.sh: one JSON line per measurement or check in RESULTS
(results.jsonl), each with its stage, its check name and ok, and the summary table. Needs only
the standard library (and NumPy to compare weight files), so that it runs in a moment.

  add RESULTS STAGE CHECK [KEY=VALUE]... [--from FILE [--pick KEY]] [--metrics FILE
      [--warmup N] [--images-per-step B]] [--weights A B] [--ok-if COND]... [--target COND]...
        Appends one line: the JSON of FILE (a whole JSON document, else its last JSON object
        line; --pick: one object inside it), the summary of a ddl-train --metrics file, the
        comparison of two --dump-weights files and the KEY=VALUE pairs (VALUE read as JSON where
        it parses). ok: every COND (FIELD<VALUE, <=, >, >=, ==, !=) holds, a failed one named in
        "failed"; a --target (a performance goal) is only reported, in targets_met or
        targets_missed.
  fail RESULTS STAGE CHECK LOG RC
        Appends a failure: the exit status (124: timed out) and the tail of LOG.
  medians RESULTS STAGE CHECK --by FIELD --value FIELD --base NAME [--target COND]...
        Appends line CHECK-VALUE: the median VALUE of each FIELD group of the ok lines of
        STAGE/CHECK (as GROUP_VALUE, '-' in names read '_'), the run counts (GROUP_runs), and
        the base group's median over each other group's (BASE_per_GROUP).
  get RESULTS STAGE CHECK FIELD
        Prints FIELD of the last line of STAGE/CHECK (nothing if there is none).
  summary RESULTS OUT.md
        Writes the table of all lines.
"""
import argparse
import json
import math
import operator
import re
import statistics
import sys

OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
       "<": operator.lt, ">": operator.gt}
COND = re.compile(r"^(\w+)(<=|>=|==|!=|<|>)(.+)$")
TAIL_LINES = 25


def value(text):
    """TEXT as JSON where it parses (numbers, true/false, null), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def json_of(path):
    """PATH as one JSON document, else the last of its lines that is a JSON object."""
    with open(path, errors="replace") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    found = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
    if found is None:
        raise SystemExit(f"report: {path}: no JSON line")
    return found


def train_summary(path, warmup, images_per_step):
    """Loss, speed and data-wait of a ddl-train --metrics file (steps after WARMUP timed)."""
    with open(path) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    steps = [l for l in lines if l.get("type") == "step"]
    epochs = [l for l in lines if l.get("type") == "epoch"]
    if not steps:
        raise SystemExit(f"report: {path}: no step lines")
    losses = [s["loss"] for s in steps]
    head, tail = losses[:5], losses[-5:]
    out = {"steps": len(steps), "finite": all(math.isfinite(x) for x in losses),
           "first_loss": statistics.fmean(head), "last_loss": statistics.fmean(tail)}
    out["learns"] = out["finite"] and out["last_loss"] < out["first_loss"]
    timed = steps[warmup:]
    if timed:
        out["timed_steps"] = len(timed)
        out["images_per_s"] = statistics.median(s["images_per_s"] for s in timed)
        out["epochs_seen"] = len({s["epoch"] for s in timed})
        if images_per_step:
            wall = sum(images_per_step / s["images_per_s"] for s in timed)
            out["data_wait_frac"] = sum(s["data_wait_s"] for s in timed) / wall
    if epochs:
        last = epochs[-1]
        out.update({k: last[k] for k in ("val_top1", "val_top5") if last.get(k) is not None})
    return out


def compare_weights(a, b, init=None):
    """Tensor by tensor comparison of two ddl-train --dump-weights files (raw f32 LE + .json);
    with INIT (the weights both started from), also how far B's update is from A's:
    update_rel_diff = |B - A| / |A - INIT| over all weights."""
    import numpy as np

    with open(a + ".json") as f:
        index = json.load(f)
    x = np.fromfile(a, dtype="<f4")
    y = np.fromfile(b, dtype="<f4")
    if x.shape != y.shape:
        return {"bitwise": False, "error": f"{a} holds {x.size} values, {b} {y.size}"}
    differ = []
    for t in index["tensors"]:
        n = math.prod(t["shape"])
        ta, tb = x[t["offset"]:t["offset"] + n], y[t["offset"]:t["offset"] + n]
        if ta.tobytes() != tb.tobytes():
            diff = float(np.abs(ta.astype(np.float64) - tb).max())
            scale = float(np.abs(ta).max()) or 1.0
            differ.append({"name": t["name"], "max_abs_diff": diff, "max_rel_diff": diff / scale})
    differ.sort(key=lambda d: -d["max_rel_diff"])
    update = {}
    if init:
        z = np.fromfile(init, dtype="<f4").astype(np.float64)
        update["update_rel_diff"] = float(np.linalg.norm(y - x.astype(np.float64))
                                          / np.linalg.norm(x - z))
    return {**update, "bitwise": not differ, "tensors": len(index["tensors"]),
            "tensors_differ": len(differ),
            "max_abs_diff": max((d["max_abs_diff"] for d in differ), default=0.0),
            "max_rel_diff": max((d["max_rel_diff"] for d in differ), default=0.0),
            "worst": differ[:5]}


def name(text):
    """TEXT as a field name (COND reads letters, digits and '_')."""
    return re.sub(r"\W", "_", str(text))


def check(fields, cond):
    """None when COND holds on FIELDS, else why not."""
    m = COND.match(cond)
    if not m:
        raise SystemExit(f"report: --ok-if {cond!r} is not FIELD<OP>VALUE")
    name, op, want = m.group(1), m.group(2), value(m.group(3))
    if name not in fields:
        return f"{cond} (no {name})"
    try:
        return None if OPS[op](fields[name], want) else f"{cond} ({name} = {fields[name]})"
    except TypeError:
        return f"{cond} ({name} = {fields[name]!r})"


def judge(line, ok_if, targets):
    """Sets LINE's ok from the OK_IF conditions and reports the TARGETS."""
    failed = [why for why in (check(line, c) for c in ok_if) if why]
    line["ok"] = line.get("ok", True) and not failed
    if failed:
        line["failed"] = failed
    if targets:
        verdicts = [(c, check(line, c)) for c in targets]
        line["targets_met"] = [c for c, why in verdicts if why is None]
        line["targets_missed"] = [why for _, why in verdicts if why]


def append(results, line):
    with open(results, "a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line))


def read(results):
    with open(results) as f:
        return [json.loads(l) for l in f if l.strip()]


def cmd_add(a):
    fields = {}
    if a.from_file:
        found = json_of(a.from_file)
        fields.update(found[a.pick] if a.pick else found)
    if a.metrics:
        fields.update(train_summary(a.metrics, a.warmup, a.images_per_step))
    if a.weights:
        fields.update(compare_weights(*a.weights, init=a.update_from))
    for kv in a.pairs:
        k, _, v = kv.partition("=")
        fields[k] = value(v)
    line = {"stage": a.stage, "check": a.check, "ok": True, **fields}
    judge(line, a.ok_if, a.target)
    append(a.results, line)


def cmd_fail(a):
    with open(a.log, errors="replace") as f:
        tail = f.readlines()[-TAIL_LINES:]
    error = f"timed out (exit {a.rc})" if a.rc in (124, 137) else f"exit status {a.rc}"
    append(a.results, {"stage": a.stage, "check": a.check, "ok": False, "error": error,
                       "log_tail": "".join(tail)})


def cmd_medians(a):
    groups = {}
    for l in read(a.results):
        if l["stage"] == a.stage and l["check"] == a.check and l["ok"] and a.value in l:
            groups.setdefault(name(l[a.by]), []).append(l[a.value])
    base = name(a.base)
    line = {"stage": a.stage, "check": f"{a.check}-{a.value}", "ok": base in groups}
    for group, values in groups.items():
        line[f"{group}_{a.value}"] = statistics.median(values)
        line[f"{group}_runs"] = len(values)
    for group in groups:
        if base in groups and group != base:
            line[f"{base}_per_{group}"] = line[f"{base}_{a.value}"] / line[f"{group}_{a.value}"]
    judge(line, [], a.target)
    append(a.results, line)


def cmd_get(a):
    found = [l for l in read(a.results) if l["stage"] == a.stage and l["check"] == a.check]
    if found and a.field in found[-1]:
        print(found[-1][a.field])


def figure(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)[:120]
    return str(v)[:120]


def cmd_summary(a):
    lines = read(a.results)
    start = next((l for l in lines if l["check"] == "start"), {})
    out = [f"# ddl on a GPU machine (tools/gpu/run.sh): {start.get('device', '?')} run of {start.get('commit', '?')}",
           "", "| stage | check | result | figures |", "|---|---|---|---|"]
    for l in lines:
        if l["check"] == "start":
            continue
        result = "ok" if l["ok"] else "FAILED"
        skip = {"stage", "check", "ok", "log_tail"}
        figures = ", ".join(f"{k} {figure(v)}" for k, v in l.items() if k not in skip)
        if not l["ok"] and l.get("log_tail"):
            figures += " / log: " + l["log_tail"].strip().splitlines()[-1][:160]
        out.append(f"| {l['stage']} | {l['check']} | {result} | {figures.replace('|', '/')} |")
    failed = sum(1 for l in lines if not l["ok"])
    out += ["", f"{len(lines) - failed} ok, {failed} failed; one JSON line each in results.jsonl,"
            " every command's output in log.txt."]
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("add")
    for arg in ("results", "stage", "check"):
        p.add_argument(arg)
    p.add_argument("--from", dest="from_file")
    p.add_argument("--pick")
    p.add_argument("--metrics")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--images-per-step", type=int, default=0)
    p.add_argument("--weights", nargs=2)
    p.add_argument("--update-from", help="with --weights: the initial weights of both")
    p.add_argument("--ok-if", action="append", default=[])
    p.add_argument("--target", action="append", default=[])
    p.add_argument("pairs", nargs="*")
    p = sub.add_parser("fail")
    for arg in ("results", "stage", "check", "log"):
        p.add_argument(arg)
    p.add_argument("rc", type=int)
    p = sub.add_parser("medians")
    for arg in ("results", "stage", "check"):
        p.add_argument(arg)
    for flag in ("--by", "--value", "--base"):
        p.add_argument(flag, required=True)
    p.add_argument("--target", action="append", default=[])
    p = sub.add_parser("get")
    for arg in ("results", "stage", "check", "field"):
        p.add_argument(arg)
    p = sub.add_parser("summary")
    p.add_argument("results")
    p.add_argument("out")
    a = ap.parse_args()
    {"add": cmd_add, "fail": cmd_fail, "medians": cmd_medians, "get": cmd_get,
     "summary": cmd_summary}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
