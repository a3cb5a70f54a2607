//! Which rank of an MPI job this process is, from its launcher's environment: for the prefix of
//! a tool's messages, before (or without) any MPI call.

/// Environment variables an MPI launcher sets (Open MPI, PMIx, MPICH/PMI, Intel MPI).
const LAUNCHER_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
];

/// True when started by an MPI launcher (from the launcher's environment).
pub fn under_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// This process's rank when started by an MPI launcher, from the launcher's environment.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// `rank N: ` under an MPI launcher, empty otherwise: the prefix of a tool's messages, so that
/// under `mpirun` each says which rank wrote it.
pub fn rank_prefix() -> String {
    launcher_rank().map_or_else(String::new, |r| format!("rank {r}: "))
}
