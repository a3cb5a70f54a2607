//! MPI integration: runs the `ddl-mpi-check` binary under `mpirun -np N` (N = 1..=5).

use std::process::Output;

use ddl_testkit::launch;

use ddl_comm::cores;

/// `mpirun --oversubscribe -np NP ddl-mpi-check ARGS` (see [`mpirun_with`]).
fn mpirun(np: usize, args: &[&str]) -> Output {
    mpirun_with(&["--oversubscribe"], np, args)
}

/// `mpirun FLAGS -np NP ddl-mpi-check ARGS` within the testkit's deadline: a hang fails the
/// test, with what the job printed, instead of holding up CI.
fn mpirun_with(flags: &[&str], np: usize, args: &[&str]) -> Output {
    launch::run(
        launch::mpirun_with(flags, np)
            .arg(env!("CARGO_BIN_EXE_ddl-mpi-check"))
            .args(args),
    )
}

/// `ddl-mpi-check MODE` must pass on each of `nps` ranks.
fn passes(mode: &str, nps: std::ops::RangeInclusive<usize>) {
    for np in nps {
        let out = mpirun(np, &[mode]);
        let all = launch::printed(&out);
        assert!(out.status.success(), "np={np}: {all}");
        assert!(
            all.contains(&format!("CHECK OK {mode} ranks={np}")),
            "np={np}: {all}"
        );
    }
}

#[test]
fn every_algorithm_matches_mpi_allreduce_on_1_to_5_ranks() {
    passes("allreduce", 1..=5);
}

#[test]
fn mismatched_calls_fail_on_every_rank_naming_them() {
    passes("mismatch", 2..=4);
}

#[test]
fn sharded_collectives_are_exact_on_1_to_8_ranks() {
    passes("sharded", 1..=8);
}

#[test]
fn two_threads_of_every_rank_use_the_world_at_once() {
    // The allreduces of a main thread beside an exchange thread's pieces (ddl-train during a
    // record exchange): before, one thread's exchange waited for the other's to end while
    // the peer it waited for waited for this one, and every rank timed out.
    passes("threads", 2..=3);
}

#[test]
fn ranks_with_a_core_each_spin_and_ranks_sharing_cores_back_off() {
    let cpus = cores::allowed_cpus();
    // Bound to one CPU each (as Open MPI binds two ranks by default, to a core each), each
    // rank's own mask holds one CPU; the node's ranks have two: they must spin, not sleep
    // between polls. Hardware threads count as CPUs, so that two threads of one core do too.
    if cpus.len() >= 2 {
        let bind = ["--use-hwthread-cpus", "--bind-to", "hwthread"];
        let out = mpirun_with(&bind, 2, &["init"]);
        let all = launch::printed(&out);
        assert!(out.status.success(), "{all}");
        assert!(
            all.contains("CHECK OK init ranks=2") && all.contains("polling=Spin"),
            "{all}"
        );
    }
    // Two unbound ranks that share one CPU: mpirun and its ranks inherit this thread's mask.
    let first = cpus[0];
    cores::pin_thread(first).unwrap_or_else(|e| panic!("pinning to CPU {first}: {e}"));
    let out = mpirun_with(&["--oversubscribe", "--bind-to", "none"], 2, &["init"]);
    let all = launch::printed(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("CHECK OK init ranks=2") && all.contains("polling=Backoff"),
        "{all}"
    );
}

#[test]
fn silent_peer_times_out_naming_recv_and_peer() {
    let out = mpirun(2, &["timeout"]);
    let all = launch::printed(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("CHECK OK timeout"), "{all}");
    assert!(
        all.contains("recv on rank 0: timed out") && all.contains("peer 1"),
        "{all}"
    );
}

#[test]
fn abort_ends_the_job_with_its_code() {
    // Rank 0 calls MPI_Abort(7) while rank 1 waits in a barrier: mpirun exits with 7 (a crash,
    // a timeout or a rank returning from the barrier gives another status).
    let out = mpirun(2, &["abort"]);
    assert_eq!(out.status.code(), Some(7), "{}", launch::printed(&out));
    assert!(
        !launch::printed(&out).contains("CHECK OK"),
        "{}",
        launch::printed(&out)
    );
}

#[test]
fn a_rank_that_fails_tells_the_others_and_every_rank_says_so() {
    // Rank 1 fails while rank 0 waits for its message and rank 2 in a shared-memory
    // allreduce, with a 60 s timeout: before, both waited it out and only rank 1 said why.
    let begun = std::time::Instant::now();
    let out = mpirun(3, &["failure"]);
    let all = launch::printed(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("rank 1 fails: rank 1's own trouble"), "{all}");
    for (rank, op) in [(0, "recv"), (2, "shm allreduce")] {
        let line = format!(
            "rank {rank} stops: {op} on rank {rank}: rank 1 failed, and the job stops: rank 1's \
             own trouble"
        );
        assert!(all.contains(&line), "{line}\n{all}");
    }
    assert!(
        begun.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        begun.elapsed()
    );
}

#[test]
fn single_threaded_mpi_is_refused_beside_other_threads() {
    // The test harness runs this test on a thread of its own beside the main thread; one more
    // is held open so that the count cannot be 1. MPI must not start (it would be initialised
    // at MPI_THREAD_SINGLE in a threaded process).
    let (stop, parked) = std::sync::mpsc::channel::<()>();
    let helper = std::thread::spawn(move || parked.recv().ok());
    let err = ddl_comm::World::init_single_threaded(std::time::Duration::from_secs(5))
        .expect_err("MPI_THREAD_SINGLE in a process with threads");
    assert!(
        err.to_string()
            .contains("MPI_THREAD_SINGLE needs a process with one thread"),
        "{err}"
    );
    assert!(!mpi::environment::is_initialized(), "MPI was initialised");
    stop.send(()).unwrap();
    helper.join().unwrap();
}
