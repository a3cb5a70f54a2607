#!/usr/bin/env bash
# Emulated two-tier cluster on one machine (root): one network namespace per "node", joined by
# a bridge, each node's link shaped with tbf (the kernel here has no netem: bandwidth only).
# Ranks on one node talk over shared memory (Open MPI's vader BTL); ranks on different nodes
# cross the shaped veth links over TCP. The tbf queue limit (NETNS_TBF_LIMIT, default 8mb) is
# sized so that the shaper delays rather than drops (drops mean TCP retransmits and collapsed
# windows: check `ip netns exec ddlcns1 tc -s qdisc show dev eth0`). Open MPI launches into the namespaces through an
# rsh agent that maps a host address to its namespace.
#
#   tools/bench/netns-cluster.sh setup [NODES] [RATE]   # default 2 nodes, 1gbit
#   tools/bench/netns-cluster.sh mpirun NP ARGS...      # mpirun over the namespaces (NP/NODES per node)
#   tools/bench/netns-cluster.sh bench [OUT_DIR]        # calibrate + allreduce tables (NETNS_RUNS, medians)
#                                                        # with the model's prediction per row, and
#                                                        # against Open MPI's in-place C loop
#                                                        # (tools/bench/mpi_allreduce.c, alternating)
#       env: NETNS_RANKS_PER_NODE (4, the reference systems' GPUs per node), NETNS_RUNS (3), NETNS_ITERS (5), NETNS_MAX_BYTES (64MiB),
#            NETNS_MIN_BYTES (1MiB), NETNS_STEP_FACTOR (4), NETNS_ALGOS,
#            NETNS_SKIP_CALIBRATE=1 (reuse OUT/netns-model.json),
#            NETNS_LOCK=FILE (run each mpirun under `flock FILE`, on a machine shared with others)
#   tools/bench/netns-cluster.sh teardown
#
# Addresses: bridge ddlcbr0 10.77.0.254/24, node i (1-based) = namespace ddlcns<i>, 10.77.0.<i>.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=ddlcns
bridge=ddlcbr0
state=/tmp/ddl-netns-cluster
agent=$state/nsrsh

nodes_up() { ip netns list | awk '{print $1}' | grep -c "^${prefix}[0-9]*$" || true; }

setup() {
  local nodes=${1:-2} rate=${2:-1gbit}
  teardown quiet
  mkdir -p "$state"
  ip link add "$bridge" type bridge
  ip addr add 10.77.0.254/24 dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq "$nodes"); do
    local ns=$prefix$i
    ip netns add "$ns"
    ip link add "ddlcv$i" type veth peer name eth0 netns "$ns"
    ip link set "ddlcv$i" master "$bridge" up
    ip netns exec "$ns" ip addr add "10.77.0.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb limit "${NETNS_TBF_LIMIT:-8mb}"
  done
  # rsh agent: `nsrsh [ssh options] HOST COMMAND...` runs COMMAND in HOST's namespace.
  cat > "$agent" <<'AGENT'
#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
node=${host##*.}
# One session directory and one shared-memory backing directory per emulated node: the
# daemons share a hostname (and /dev/shm), so vader's segment files
# (vader_segment.HOST.JOB.LOCALRANK) of equal local ranks on different nodes would collide.
dir=/tmp/ddl-netns-cluster/tmp$node
mkdir -p "$dir"
exec ip netns exec "ddlcns$node" env OMPI_MCA_orte_tmpdir_base="$dir" \
  OMPI_MCA_btl_vader_backing_directory="$dir" sh -c "$*"
AGENT
  chmod +x "$agent"
  echo "$nodes $rate" > "$state/config"
  echo "netns-cluster: $nodes nodes at $rate per node link (10.77.0.1..$nodes)"
}

teardown() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^${prefix}[0-9]*$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$ns"
  done
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link del "$bridge"
  fi
  rm -rf "$state"
  [ "${1:-}" = quiet ] || echo "netns-cluster: torn down"
}

run_mpi() {
  local np=$1; shift
  [ -f "$state/config" ] || { echo "netns-cluster: run setup first" >&2; exit 1; }
  local nodes; nodes=$(cut -d' ' -f1 "$state/config")
  local per=$(( (np + nodes - 1) / nodes )) hosts=""
  for i in $(seq "$nodes"); do hosts="${hosts:+$hosts,}10.77.0.$i:$per"; done
  # Ranks are placed host-contiguously (Open MPI's default mapping by slot: ranks 0..per-1 on
  # the first host, and so on). All ranks share this machine's cores, so Open MPI's blocking
  # calls (the `mpi` baseline) yield the core while they wait, as ddl's own polling does.
  ${NETNS_LOCK:+flock "$NETNS_LOCK"} mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 \
    --mca plm_rsh_agent "$agent" --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --host "$hosts" -np "$np" "$@"
}

bench() {
  local out=${1:-bench-out}
  mkdir -p "$out"
  [ -f "$state/config" ] || { echo "netns-cluster: run setup first" >&2; exit 1; }
  local nodes; nodes=$(cut -d' ' -f1 "$state/config")
  local np=$(( nodes * ${NETNS_RANKS_PER_NODE:-4} ))
  local bin=$PWD/target/release/ddl-bench
  if [ "${NETNS_SKIP_CALIBRATE:-0}" != 1 ]; then
    echo "netns-cluster: calibrate ($np ranks, $nodes nodes)"
    run_mpi "$np" "$bin" calibrate -o "$out/netns-model.json" --max-bytes "${NETNS_MAX_BYTES:-64MiB}"
  fi
  local peer=$PWD/target/peers/mpi_allreduce
  mkdir -p "$(dirname "$peer")"
  mpicc -O2 -Wall -o "$peer" tools/bench/mpi_allreduce.c
  : > "$out/allreduce-netns.jsonl"
  : > "$out/allreduce-netns-c.jsonl"
  for run in $(seq "${NETNS_RUNS:-3}"); do
    echo "netns-cluster: run $run: Open MPI's in-place C loop"
    run_mpi "$np" "$peer" --min-bytes "${NETNS_MIN_BYTES:-1MiB}" --max-bytes "${NETNS_MAX_BYTES:-64MiB}" \
      --iters "${NETNS_ITERS:-5}" --warmup 1 --step-factor "${NETNS_STEP_FACTOR:-4}" \
      | grep '^{' >> "$out/allreduce-netns-c.jsonl"
    echo "netns-cluster: allreduce table, run $run (measured vs the model's prediction)"
    run_mpi "$np" "$bin" allreduce --algos "${NETNS_ALGOS:-ring,rhd,multicolor,multiring,hierarchical,hierarchical:mpi,mpi,auto}" \
      --min-bytes "${NETNS_MIN_BYTES:-1MiB}" --max-bytes "${NETNS_MAX_BYTES:-64MiB}" --iters "${NETNS_ITERS:-5}" \
      --step-factor "${NETNS_STEP_FACTOR:-4}" --warmup 1 --model-file "$out/netns-model.json" --json | grep '^{' >> "$out/allreduce-netns.jsonl"
  done
  python3 - "$out/allreduce-netns.jsonl" <<'PY'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["algo"], r["bytes"])].append(r)
ring = {b: statistics.median(x["time_us"] for x in rs) for (a, b), rs in rows.items() if a == "ring"}
print(f"{'algo':>22} {'bytes':>10} {'runs':>4} {'time_ms':>9} {'min-max':>15} {'busbw':>7} {'x ring':>6} {'pred_ms':>9} {'meas/pred':>9}")
for (algo, b), rs in sorted(rows.items()):
    ts = [r["time_us"] / 1e3 for r in rs]
    t = statistics.median(ts)
    bw = statistics.median(r["busbw_gbps"] for r in rs)
    pred = rs[0]["predicted_us"] / 1e3
    x = f"{ring[b] / 1e3 / t:.2f}" if b in ring else "-"
    ran = " ran " + ",".join(sorted({r["resolved"] for r in rs})) if algo == "auto" else ""
    spread = f"{min(ts):.1f}-{max(ts):.1f}"
    print(f"{algo:>22} {b:>10} {len(rs):>4} {t:>9.1f} {spread:>15} {bw:>7.3f} {x:>6} {pred:>9.1f} {t / pred:>9.2f}{ran}")
PY
  python3 tools/bench/allreduce_table.py "$out/allreduce-netns-c.jsonl" "$out/allreduce-netns.jsonl"
}

case "${1:-}" in
  setup) shift; setup "$@" ;;
  teardown) teardown ;;
  mpirun) shift; run_mpi "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: $0 setup [NODES] [RATE] | mpirun NP ARGS... | bench [OUT_DIR] | teardown" >&2; exit 2 ;;
esac
