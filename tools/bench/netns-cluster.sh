#!/usr/bin/env bash
# Emulated two-tier cluster on one machine (root): one network namespace per "node", joined by
# a bridge, each node's link shaped with tbf (the kernel here has no netem: bandwidth only).
# Ranks on one node talk over that node's own address (kernel loopback path, unshaped); ranks on
# different nodes cross the shaped veth links. Open MPI launches into the namespaces through an
# rsh agent that maps a host address to its namespace.
#
#   tools/bench/netns-cluster.sh setup [NODES] [RATE]   # default 2 nodes, 1gbit
#   tools/bench/netns-cluster.sh mpirun NP ARGS...      # mpirun over the namespaces (NP/NODES per node)
#   tools/bench/netns-cluster.sh bench [OUT_DIR]        # allreduce table + calibrate + sim check
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
  mpirun --allow-run-as-root --oversubscribe \
    --mca plm_rsh_agent "$agent" --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --host "$hosts" -np "$np" "$@"
}

bench() {
  local out=${1:-bench-out}
  mkdir -p "$out"
  [ -f "$state/config" ] || { echo "netns-cluster: run setup first" >&2; exit 1; }
  local nodes; nodes=$(cut -d' ' -f1 "$state/config")
  local np=$(( nodes * 2 ))
  local bin=$PWD/target/release/ddl-bench
  echo "netns-cluster: calibrate ($np ranks, $nodes nodes)"
  run_mpi "$np" "$bin" calibrate -o "$out/netns-model.json" | tail -n +1
  echo "netns-cluster: allreduce table"
  run_mpi "$np" "$bin" allreduce --algos ring,rhd,multicolor,multiring,mpi \
    --min-bytes 64KiB --max-bytes "${NETNS_MAX_BYTES:-16MiB}" --iters "${NETNS_ITERS:-5}" --warmup 2 \
    --json | grep '^{' | tee "$out/allreduce-netns.jsonl"
  echo "netns-cluster: model prediction vs measured"
  python3 - "$out/netns-model.json" "$out/allreduce-netns.jsonl" "$nodes" <<'PY'
import json, subprocess, sys
model, rows, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(f"{'algo':>22} {'bytes':>10} {'measured_us':>12} {'predicted_us':>13} {'ratio':>7}")
for line in open(rows):
    r = json.loads(line)
    if r["algo"] == "mpi":
        continue
    out = subprocess.run(["target/release/ddl-bench", "predict", "--model-file", model,
                          "--nodes", str(nodes), "--ranks-per-node", str(r["ranks"] // nodes),
                          "--algo", r["algo"], "--bytes", str(r["bytes"])],
                         capture_output=True, text=True, check=True).stdout
    pred = json.loads(out)["time_us"]
    print(f"{r['algo']:>22} {r['bytes']:>10} {r['time_us']:>12.0f} {pred:>13.0f} {r['time_us'] / pred:>7.2f}")
PY
}

case "${1:-}" in
  setup) shift; setup "$@" ;;
  teardown) teardown ;;
  mpirun) shift; run_mpi "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: $0 setup [NODES] [RATE] | mpirun NP ARGS... | bench [OUT_DIR] | teardown" >&2; exit 2 ;;
esac
