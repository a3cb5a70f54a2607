//! MPI integration: runs the `ddl-mpi-check` binary under `mpirun -np N` (N = 1..=5).

use std::process::{Command, Output};

fn mpirun(np: usize, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("300")
        .arg("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
        ])
        .arg(env!("CARGO_BIN_EXE_ddl-mpi-check"))
        .args(args)
        .output()
        .expect("mpirun (Open MPI) must be installed")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_algorithm_matches_mpi_allreduce_on_1_to_5_ranks() {
    for np in 1..=5 {
        let out = mpirun(np, &["allreduce"]);
        let all = text(&out);
        assert!(out.status.success(), "np={np}: {all}");
        assert!(
            all.contains(&format!("CHECK OK allreduce ranks={np}")),
            "np={np}: {all}"
        );
    }
}

#[test]
fn silent_peer_times_out_naming_recv_and_peer() {
    let out = mpirun(2, &["timeout"]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("CHECK OK timeout"), "{all}");
    assert!(
        all.contains("recv on rank 0: timed out") && all.contains("peer 1"),
        "{all}"
    );
}

#[test]
fn abort_ends_the_job_with_its_code() {
    let out = mpirun(2, &["abort"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("CHECK OK"), "{}", text(&out));
}
