//! ddl-mpi-check: MPI self-check of ddl-comm (run under mpirun; driven by `comm/tests/mpi.rs`,
//! also useful to validate a cluster's MPI set-up).
//!
//! `ddl-mpi-check allreduce`: every algorithm (`shm` across the processes of this node
//! included, and at 4+ ranks `hierarchical` with the node's ranks posing as two nodes) on
//! awkward sizes (0, 1, < ranks, odd, 1 MiB + 3) compared bitwise with
//! MPI_Allreduce, f16 included; node layout sanity; split, barrier.
//! `ddl-mpi-check sharded`: allgather, reduce-scatter (sum and max) and the allreduce with
//! `max` of every algorithm (`shm` across the processes of this node included) on awkward
//! sizes and uneven parts (empty ones too), compared bitwise with the sequential results.
//! `ddl-mpi-check mismatch`: the last rank passes another count or element type than the
//! others: every algorithm must fail on every rank naming it, and stay usable.
//! `ddl-mpi-check timeout`: rank 0 receives from rank 1, which never sends: the receive must
//! fail within the timeout with an error naming `recv` and `peer 1`.
//! `ddl-mpi-check abort`: rank 0 aborts the job with code [`ABORT_CODE`] (7) while rank 1
//! waits in a barrier; mpirun must end the job and exit with that code.
//! `ddl-mpi-check init`: start MPI and pass a barrier.
//! `ddl-mpi-check threads`: two threads of every rank use the world at once, as ddl-train's
//! main thread (allreduces, each with its call check) and record-exchange thread (pieces to
//! and from every other rank) do; both must finish within a short timeout, which a thread
//! waiting on another thread's requests (a deadlock across ranks) would run out.
//! `ddl-mpi-check failure` (3+ ranks): rank 1 fails and tells the others while rank 0 waits
//! for its message and the other ranks wait in a shared-memory allreduce: every rank must
//! print a line naming rank 1 and its reason, and the job end with [`FAILED_CODE`] (3) well
//! within the 60 s timeout.
//!
//! Prints `CHECK OK <mode>` on rank 0 (with the layout and how the ranks poll) when everything
//! passed; exits non-zero otherwise.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::World;
use ddl_comm::{
    f16, Algorithm, Allreducer, CommError, CostModel, Multiring, Op, Parts, Reduce, ShardAlgorithm,
    Sharded, Topology, Transport,
};

/// Exit code of `ddl-mpi-check abort`: distinctive, so that a crash or a timeout cannot pass
/// for it.
const ABORT_CODE: i32 = 7;

/// Exit code of `ddl-mpi-check failure`.
const FAILED_CODE: i32 = 3;

fn input(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729 + salt * 31) % 2001) as f32 - 1000.0)
        .collect()
}

fn allreduce_checks(world: &World) -> Result<(), String> {
    let t: Arc<dyn Transport> = world.transport();
    let p = world.size();
    if world.node_count() * world.local_size() != p && world.topology().nodes > 1 {
        return Err("inconsistent node layout".into());
    }
    if world.node_index() >= world.node_count() || world.local_rank() >= world.local_size() {
        return Err(format!("bad node layout {world:?}"));
    }
    let mut algos: Vec<(Algorithm, Topology)> = [
        "ring",
        "rhd",
        "multicolor",
        "multicolor:2:64",
        "multiring",
        "shm",
        "shm:4096",
        "auto",
        "mpi",
    ]
    .iter()
    .map(|s| (s.parse().expect("known algorithm"), world.topology()))
    .collect();
    if p == 4 {
        for segments in [0, 3] {
            algos.push((
                Algorithm::Multiring(Multiring {
                    dims: vec![2, 2],
                    segments,
                }),
                world.topology(),
            ));
        }
    }
    if p >= 4 && p % 2 == 0 {
        // This node's ranks posing as two nodes: each half meets in its own shared region,
        // and the ranks of equal local index reduce between the halves over MPI.
        let halves = Topology::new(2, p / 2);
        for name in [
            "hierarchical",
            "hierarchical:mpi",
            "hierarchical:ring",
            "hierarchical:rhd:4096",
            "auto",
        ] {
            algos.push((name.parse().expect("known algorithm"), halves));
        }
    }
    let sizes = [0, 1, p.saturating_sub(1), 2 * p + 1, 1001, (1 << 18) + 3];
    let mpi =
        Allreducer::new(t.clone(), Algorithm::Mpi, world.topology()).map_err(|e| e.to_string())?;
    for (algo, topology) in &algos {
        let ar = Allreducer::new(t.clone(), algo.clone(), *topology).map_err(|e| e.to_string())?;
        let algo = format!("{algo} over {}x{}", topology.nodes, topology.ranks_per_node);
        for (salt, &len) in sizes.iter().enumerate() {
            let mut expect = input(world.rank(), len, salt);
            mpi.allreduce_f32(&mut expect, false)
                .map_err(|e| e.to_string())?;
            let mut got = input(world.rank(), len, salt);
            ar.allreduce_f32(&mut got, false)
                .map_err(|e| format!("{algo} len {len}: {e}"))?;
            let bad = got
                .iter()
                .zip(&expect)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if bad > 0 {
                return Err(format!(
                    "{algo} len {len}: {bad} elements differ from MPI_Allreduce on rank {}",
                    world.rank()
                ));
            }
            // Half precision: the f32 sum rounded once.
            let mut h: Vec<f16> = input(world.rank(), len, salt)
                .iter()
                .map(|&v| f16::from_f32(v / 64.0))
                .collect();
            ar.allreduce_f16(&mut h, false)
                .map_err(|e| format!("{algo} f16 len {len}: {e}"))?;
            for (i, v) in h.iter().enumerate() {
                if v.to_bits() != f16::from_f32(expect[i] / 64.0).to_bits() {
                    return Err(format!(
                        "{algo} f16 len {len}: element {i} is {v}, expected {}",
                        expect[i] / 64.0
                    ));
                }
            }
        }
    }
    // Split into node-local groups and allreduce the world rank there.
    let sub = t
        .split(world.node_index(), world.local_rank())
        .map_err(|e| e.to_string())?;
    if sub.size() != world.local_size() || sub.rank() != world.local_rank() {
        return Err(format!("split gave rank {} of {}", sub.rank(), sub.size()));
    }
    sub.barrier().map_err(|e| e.to_string())?;
    t.barrier().map_err(|e| e.to_string())?;
    Ok(())
}

/// One rank's buffer in a call of [`mismatch_checks`].
enum Buffer {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// Ranks that pass different buffers: every algorithm must fail on every rank with the
/// mismatch error naming the odd rank, before touching a buffer and well within the timeout,
/// and leave the communicator usable.
fn mismatch_checks(world: &World) -> Result<(), String> {
    let t: Arc<dyn Transport> = world.transport();
    let (p, me) = (world.size(), world.rank());
    let timeout = Duration::from_secs(30);
    t.set_timeout(timeout);
    let last = p - 1;
    let mut algos: Vec<(Algorithm, Topology)> = [
        "ring",
        "rhd",
        "multicolor",
        "multicolor:1",
        "multiring",
        "shm",
        "auto",
        "mpi",
    ]
    .iter()
    .map(|s| (s.parse().expect("known algorithm"), world.topology()))
    .collect();
    if p >= 4 && p % 2 == 0 {
        for name in ["hierarchical", "hierarchical:mpi", "auto"] {
            algos.push((
                name.parse().expect("known algorithm"),
                Topology::new(2, p / 2),
            ));
        }
    }
    // (this rank's buffer, what the error must say about the last rank)
    let cases: Vec<(Buffer, String)> = vec![
        (
            Buffer::F32(vec![1.0; if me == last { 1000 } else { 10 }]),
            format!("rank {last} passed 1000 f32"),
        ),
        (
            Buffer::F32(vec![1.0; if me == last { 300_000 } else { 1000 }]),
            format!("rank {last} passed 300000 f32"),
        ),
        (
            if me == last {
                Buffer::F16(vec![f16::ONE; 300])
            } else {
                Buffer::F32(vec![1.0; 300])
            },
            format!("rank {last} passed 300 f16"),
        ),
    ];
    for (algo, topology) in &algos {
        let ar = Allreducer::new(t.clone(), algo.clone(), *topology).map_err(|e| e.to_string())?;
        let what = format!("{algo} over {}x{}", topology.nodes, topology.ranks_per_node);
        for (buffer, needle) in &cases {
            let start = Instant::now();
            let (result, untouched) = match buffer {
                Buffer::F32(v) => {
                    let mut b = v.clone();
                    (ar.allreduce_f32(&mut b, false), b == *v)
                }
                Buffer::F16(v) => {
                    let mut b = v.clone();
                    (ar.allreduce_f16(&mut b, false), b == *v)
                }
            };
            let elapsed = start.elapsed();
            match result {
                Err(e @ CommError::Mismatch { .. }) if e.to_string().contains(needle.as_str()) => {}
                other => return Err(format!("{what}, {needle}: rank {me} got {other:?}")),
            }
            if !untouched || elapsed > timeout / 3 {
                return Err(format!(
                    "{what}, {needle}: buffer untouched {untouched}, failed after {elapsed:?}"
                ));
            }
        }
        // The failed calls left nothing behind: the next one sums.
        let mut ones = vec![1.0f32; 100];
        ar.allreduce_f32(&mut ones, false)
            .map_err(|e| format!("{what}: the call after the mismatches: {e}"))?;
        if ones.iter().any(|&v| v != p as f32) {
            return Err(format!(
                "{what}: the call after the mismatches summed wrongly"
            ));
        }
    }
    t.barrier().map_err(|e| e.to_string())
}

/// Every rank's expected results of the sharded collectives on [`input`] under `parts`:
/// (the allgather, this rank's sum, this rank's max, the max everywhere).
fn sharded_expected(p: usize, me: usize, parts: &Parts, salt: usize) -> [Vec<f32>; 4] {
    let len = parts.len();
    let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, salt)).collect();
    let owner = |i: usize| (0..p).find(|&q| parts.range(q).contains(&i)).unwrap_or(0);
    let gathered = (0..len).map(|i| inputs[owner(i)][i]).collect();
    let sum: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect();
    let max: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).fold(f32::MIN, f32::max))
        .collect();
    let mine = parts.range(me);
    [
        gathered,
        sum[mine.clone()].to_vec(),
        max[mine].to_vec(),
        max,
    ]
}

fn sharded_checks(world: &World) -> Result<(), String> {
    let t: Arc<dyn Transport> = world.transport();
    let (p, me) = (world.size(), world.rank());
    let mut cases: Vec<Parts> = [0, 1, p.saturating_sub(1), 2 * p + 1, 1001, (1 << 18) + 3]
        .iter()
        .map(|&len| Parts::even(len, p))
        .collect();
    // Uneven: rank q owns 37 q elements (rank 0 none), as a class count split unevenly.
    cases.push(Parts::from_counts(
        &(0..p).map(|q| 37 * q).collect::<Vec<_>>(),
    ));
    for name in ["ring", "shm", "shm:4096", "auto"] {
        let algo: ShardAlgorithm = name.parse().map_err(|e: CommError| e.to_string())?;
        let s = Sharded::new(t.clone(), algo, world.topology(), CostModel::default())
            .map_err(|e| e.to_string())?;
        for (salt, parts) in cases.iter().enumerate() {
            let len = parts.len();
            let mine = parts.range(me);
            let mut gathered = vec![f32::NAN; len];
            gathered[mine.clone()].copy_from_slice(&input(me, len, salt)[mine.clone()]);
            let fail = |what: &str, e: CommError| format!("{name} {what} len {len}: {e}");
            s.all_gather(&mut gathered, parts)
                .map_err(|e| fail("allgather", e))?;
            let mut sum = input(me, len, salt);
            s.reduce_scatter(&mut sum, parts, Reduce::Sum)
                .map_err(|e| fail("reduce-scatter", e))?;
            let mut max = input(me, len, salt);
            s.reduce_scatter(&mut max, parts, Reduce::Max)
                .map_err(|e| fail("reduce-scatter max", e))?;
            let mut all = input(me, len, salt);
            s.allreduce_max(&mut all)
                .map_err(|e| fail("allreduce max", e))?;
            let got = [
                gathered,
                sum[mine.clone()].to_vec(),
                max[mine].to_vec(),
                all,
            ];
            let want = sharded_expected(p, me, parts, salt);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                if g.iter().zip(w).any(|(a, b)| a.to_bits() != b.to_bits()) || g.len() != w.len() {
                    return Err(format!(
                        "{name} len {len}: result {k} (allgather, sum, max, allreduce max) \
                         differs on rank {me}"
                    ));
                }
            }
        }
    }
    t.barrier().map_err(|e| e.to_string())
}

fn timeout_check(world: &World) -> Result<(), String> {
    let t = world.transport();
    if world.size() < 2 {
        return Err("the timeout check needs 2 ranks".into());
    }
    let timeout = Duration::from_millis(500);
    t.set_timeout(timeout);
    if world.rank() == 0 {
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let err = t
            .recv(1, 7, &mut buf)
            .err()
            .ok_or("recv from a silent peer succeeded")?;
        let elapsed = start.elapsed();
        let msg = err.to_string();
        println!("rank 0 got: {msg} after {elapsed:?}");
        if !matches!(
            err,
            CommError::Timeout {
                op: "recv",
                peer: Some(1),
                ..
            }
        ) || !msg.contains("peer 1")
        {
            return Err(format!("unexpected error: {msg}"));
        }
        if elapsed < timeout || elapsed > timeout * 20 {
            return Err(format!(
                "timed out after {elapsed:?}, configured {timeout:?}"
            ));
        }
    }
    t.set_timeout(Duration::from_secs(60));
    t.barrier().map_err(|e| e.to_string())
}

/// Rounds of each thread in the `threads` check.
const THREAD_ROUNDS: usize = 400;

fn threads_check(world: &World) -> Result<(), String> {
    let t: Arc<dyn Transport> = world.transport();
    let p = world.size();
    t.set_timeout(Duration::from_secs(5));
    let exchanging = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || exchange_rounds(&*t))
    };
    let ar = Allreducer::new(Arc::clone(&t), Algorithm::Ring, Topology::flat(p))
        .map_err(|e| e.to_string())?;
    let me = world.rank();
    let mut summed = Ok(());
    for round in 0..THREAD_ROUNDS {
        let mut buf = vec![(me + round) as f32; 1 + round % 7];
        summed = ar.allreduce_f32(&mut buf, false).map_err(|e| e.to_string());
        let want = (0..p).map(|r| (r + round) as f32).sum::<f32>();
        if summed.is_err() || buf.iter().any(|&v| v != want) {
            summed = summed.and(Err(format!("round {round}: {buf:?}, expected {want}")));
            break;
        }
    }
    let exchanged = exchanging
        .join()
        .map_err(|_| "the exchange thread panicked")?;
    summed.and(exchanged.map_err(|e| format!("exchange thread: {e}")))?;
    t.set_timeout(Duration::from_secs(60));
    t.barrier().map_err(|e| e.to_string())
}

/// A piece to and from every other rank per round, on the record exchange's tag.
fn exchange_rounds(t: &dyn Transport) -> Result<(), CommError> {
    let (p, me) = (t.size(), t.rank());
    let tag = ddl_comm::tags::EXCHANGE.tag(1);
    for round in 0..THREAD_ROUNDS {
        let mine = vec![(me + round) as u8; 64 + round % 5];
        let mut theirs: Vec<Vec<u8>> = (0..p).map(|_| vec![0; 64 + round % 5]).collect();
        let mut ops: Vec<Op<'_>> = Vec::new();
        for (q, buf) in theirs.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            ops.push(Op::Send {
                to: q,
                tag,
                data: &mine,
            });
            ops.push(Op::Recv { from: q, tag, buf });
        }
        t.exchange(&mut ops)?;
        drop(ops);
        if let Some(q) = (0..p).find(|&q| q != me && theirs[q][0] != (q + round) as u8) {
            return Err(CommError::InvalidArgument(format!(
                "round {round}: rank {q}'s piece is wrong"
            )));
        }
    }
    Ok(())
}

/// Rank 1 fails (see the module documentation); every rank ends the job through
/// [`World::end_failed`].
fn failure_check(world: &World) -> ! {
    let t: Arc<dyn Transport> = world.transport();
    t.set_timeout(Duration::from_secs(60));
    let ar = Allreducer::new(Arc::clone(&t), Algorithm::SHM, Topology::flat(world.size()))
        .and_then(|ar| ar.allreduce_f32(&mut [1.0; 1000], false).map(|()| ar));
    let waited = match (world.rank(), ar) {
        (1, _) => {
            let reason = "rank 1's own trouble";
            println!("rank 1 fails: {reason}");
            world.end_failed(reason, FAILED_CODE)
        }
        (0, _) => t.recv(1, 7, &mut [0u8; 4]).map_err(|e| e.to_string()),
        (_, Ok(ar)) => ar
            .allreduce_f32(&mut [1.0; 1000], false)
            .map_err(|e| e.to_string()),
        (_, Err(e)) => Err(e.to_string()),
    };
    let said = waited.err().unwrap_or_else(|| "nothing failed".into());
    println!("rank {} stops: {said}", world.rank());
    world.end_failed(&said, 1)
}

fn main() -> ExitCode {
    ddl_cli::init_binary_signals();
    let mode = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "allreduce".into());
    let world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("MPI init failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match mode.as_str() {
        "allreduce" => allreduce_checks(&world),
        "sharded" => sharded_checks(&world),
        "init" => world.transport().barrier().map_err(|e| e.to_string()),
        "timeout" => timeout_check(&world),
        "mismatch" => mismatch_checks(&world),
        "threads" => threads_check(&world),
        "failure" => failure_check(&world),
        "abort" => {
            if world.rank() == 0 {
                world.abort(ABORT_CODE);
            }
            world.transport().barrier().map_err(|e| e.to_string())
        }
        other => Err(format!("unknown mode {other}")),
    };
    match result {
        Ok(()) => {
            if world.rank() == 0 {
                println!(
                    "CHECK OK {mode} ranks={} nodes={} local_size={} polling={:?}",
                    world.size(),
                    world.node_count(),
                    world.local_size(),
                    world.polling()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {}: CHECK FAILED {mode}: {e}", world.rank());
            world.abort(1)
        }
    }
}
