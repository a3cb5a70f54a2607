"""The tables of tools/bench/comm_order.sh from the files it leaves in OUT_DIR.

Usage: python3 tools/bench/comm_order_report.py OUT_DIR RUNS SKIP BATCH SIZE CLASSES DDL_BENCH
           "MODELS" "PY_MODELS" "PARTS" ALLREDUCE REPLICAS

REPLICAS: CPU replicas per rank on the cluster (8 in all: 8 / REPLICAS ranks).
"""
import json
import re
import statistics
import subprocess
import sys

med = statistics.median


def listed(values):
    """`values` as 3-decimal numbers, comma-separated."""
    return ", ".join(f"{v:.3f}" for v in values)


def train_runs(out, where, m, order, runs, skip):
    """Per run: the mean step after `skip` steps (the run's wall time per step, which its
    throughput sees; a median would hide steps that are slow every few steps) and the medians
    of the step's compute, allreduce and forward-wait times."""
    rows = []
    for r in range(1, runs + 1):
        steps = [json.loads(line) for line in open(f"{out}/{where}-{m}-{order}-{r}.jsonl")
                 if '"step"' in line][skip:]
        rows.append({"step": statistics.fmean(s["step_s"] for s in steps),
                     **{k: med(s[k + "_s"] for s in steps)
                        for k in ("compute", "allreduce", "forward_wait")}})
    return rows


def report_train(out, where, models, runs, skip, batch, size, replicas):
    """The fifo / priority table of `where`; returns per model (gain, compute, step) of fifo."""
    layout = (f"2 emulated nodes x {4 // replicas} rank(s) x {replicas} CPU replica(s)"
              if where == "cluster" else "2 ranks, one node")
    print(f"## {where}: ddl-train, {layout}, {size} px, batch {batch} per replica, median of "
          f"{runs} runs of the mean step (steps {skip + 1}-)")
    measured = {}
    for m in models:
        res = {o: train_runs(out, where, m, o, runs, skip) for o in ("fifo", "priority")}
        for o, rows in res.items():
            print(f"{m} {o:>8}: step {med(r['step'] for r in rows):.3f} s (runs: "
                  f"{listed(r['step'] for r in rows)}); compute "
                  f"{med(r['compute'] for r in rows):.3f} s, allreduce "
                  f"{med(r['allreduce'] for r in rows):.3f} s, forward wait "
                  f"{med(r['forward_wait'] for r in rows):.3f} s")
        pairs = [f["step"] / p["step"] for f, p in zip(res["fifo"], res["priority"])]
        fifo = med(r["step"] for r in res["fifo"])
        gain = fifo / med(r["step"] for r in res["priority"])
        print(f"{m}: fifo / priority {gain:.3f}x (pairs: {listed(pairs)}; median pair "
              f"{med(pairs):.3f})")
        measured[m] = (gain, med(r["compute"] for r in res["fifo"]), fifo)
    return measured


def report_sim(out, measured, bench, classes, size, batch, allreduce, replicas):
    """ddl-bench sim's prediction for the cluster's ranks with its calibrated model, the runs'
    allreduce and the contention of CPU replicas and communication on the same cores."""
    print("## ddl-bench sim with the cluster's calibrated model and the fifo runs' compute")
    for m, (gain, compute, step) in measured.items():
        cmd = [bench, "sim", "--nodes", "2", "--gpus-per-node", str(4 // replicas), "--model", m,
               "--classes", str(classes), "--image-size", str(size), "--batch", str(batch),
               "--step-compute-ms", f"{compute * 1e3:.1f}",
               "--model-file", f"{out}/netns-model.json", "--allreduce", allreduce,
               "--cpu-replicas", "--json"]
        lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        sched = {r["order"]: r for r in map(json.loads, lines.splitlines()) if "order" in r}
        pred = sched["fifo"]["step_ms"] / sched["priority"]["step_ms"]
        print(f"{m}: predicted fifo {sched['fifo']['step_ms']:.0f} ms, priority "
              f"{sched['priority']['step_ms']:.0f} ms, gain {pred:.3f}x; measured fifo "
              f"{step * 1e3:.0f} ms, gain {gain:.3f}x; predicted / measured gain "
              f"{pred / gain:.3f} (" + " ".join(cmd[1:]) + ")")


def python_runs(out, m, order, runs):
    """Per run, the job's seconds per step: the slowest rank's (mpirun may join the ranks'
    JSON lines, so objects are read wherever they are)."""
    per_run = []
    for r in range(1, runs + 1):
        text = open(f"{out}/python-{m}-{order}-{r}.jsonl").read()
        ranks = [json.loads(x) for x in re.findall(r"\{[^{}]*\}", text)]
        per_run.append(max(x["seconds"] / x["steps"] for x in ranks))
    return per_run


def report_python(out, py_models, runs, size, batch):
    print(f"## Python DistributedOptimizer on the cluster, {size} px, batch {batch} per rank, "
          f"median of {runs} runs")
    for m in py_models:
        step = {o: python_runs(out, m, o, runs) for o in ("fifo", "priority")}
        for o, per_run in step.items():
            print(f"{m} {o:>8}: step {med(per_run):.3f} s (runs: {listed(per_run)})")
        pairs = [f / p for f, p in zip(step["fifo"], step["priority"])]
        print(f"{m}: fifo / priority {med(step['fifo']) / med(step['priority']):.3f}x (pairs: "
              f"{listed(pairs)}; median pair {med(pairs):.3f})")


def main():
    out, runs, skip, batch, size, classes, bench = sys.argv[1:8]
    models, py_models, parts = sys.argv[8].split(), sys.argv[9].split(), sys.argv[10].split()
    allreduce, replicas = sys.argv[11], int(sys.argv[12])
    runs, skip, batch = int(runs), int(skip), int(batch)
    measured = {}
    for where in ("cluster", "node"):
        if where in parts:
            measured[where] = report_train(out, where, models, runs, skip, batch, size,
                                           replicas if where == "cluster" else 1)
    if "sim" in parts and "cluster" in measured:
        report_sim(out, measured["cluster"], bench, classes, size, batch, allreduce, replicas)
    if "python" in parts:
        report_python(out, py_models, runs, size, batch)


if __name__ == "__main__":
    main()
