//! Allreduce algorithm names and parameters, and the parameters' defaults: the user's choice,
//! parsed and printed. What runs it is in [`crate::allreduce`] (which reads the defaults from
//! here; nothing here reads from there).

use std::fmt;
use std::str::FromStr;

use crate::error::CommError;

/// Default number of colors of `multicolor` ([`Algorithm::MULTICOLOR`]).
pub(crate) const MULTICOLOR_COLORS: usize = 4;

/// Default pipeline chunk of `multicolor`, in bytes ([`Algorithm::MULTICOLOR`]). Every pipeline
/// step is a lock-step exchange among tree neighbours, so on slow links each step costs
/// milliseconds of synchronisation and larger chunks ran faster there (BENCHMARKS.md, "Figures
/// behind the defaults").
pub(crate) const MULTICOLOR_CHUNK_BYTES: usize = 1024 * 1024;

/// Default chunk per rank of `shm`, in bytes ([`Algorithm::SHM`]).
pub(crate) const SHM_CHUNK_BYTES: usize = 512 << 10;

/// Default chunk per rank of the node stage of `hierarchical`, in bytes
/// ([`Algorithm::hierarchical`]): each chunk's parts cross between the nodes in one blocking
/// allreduce per rank, so chunks pay that latency; past 4 MiB larger chunks gained nothing
/// (BENCHMARKS.md, "Figures behind the defaults").
pub(crate) const HIERARCHICAL_CHUNK_BYTES: usize = 4 << 20;

/// The allreduce between the nodes of [`Algorithm::Hierarchical`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Across {
    /// [`Algorithm::Ring`].
    Ring,
    /// [`Algorithm::Rhd`].
    Rhd,
    /// [`Algorithm::Mpi`] (MPI transport only).
    Mpi,
}

impl Across {
    /// The algorithm run between the nodes.
    pub fn algorithm(self) -> Algorithm {
        match self {
            Across::Ring => Algorithm::Ring,
            Across::Rhd => Algorithm::Rhd,
            Across::Mpi => Algorithm::Mpi,
        }
    }
}

/// An allreduce algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Ring: reduce-scatter then allgather, `2(p-1)` steps of `n/p`.
    Ring,
    /// Rabenseifner recursive halving (reduce-scatter) and doubling (allgather); ranks beyond
    /// the largest power of two are folded in first and out last.
    Rhd,
    /// `colors` trees with distinct roots and interior nodes, run concurrently, each
    /// pipelined in chunks of `chunk_bytes`.
    Multicolor {
        /// Number of colors (buffer parts / trees).
        colors: usize,
        /// Pipeline chunk in bytes.
        chunk_bytes: usize,
    },
    /// Multi-dimensional ring over `dims` (fastest tier first); empty = from the topology.
    /// The buffer is cut into `segments` pipeline segments whose tiers overlap.
    Multiring {
        /// Ring dimensions; their product must equal the number of ranks.
        dims: Vec<usize>,
        /// Pipeline segments; 0 = automatic: as many as keep each rank's messages at 512 KiB
        /// or more (at most 16) when two or more dimensions exceed 1, otherwise 1.
        segments: usize,
    },
    /// Node shared memory: every rank copies chunks of `chunk_bytes` into a region all ranks
    /// map, sums its share of each chunk there and copies the others' sums back (all ranks
    /// on one node only).
    Shm {
        /// Chunk per rank, in bytes.
        chunk_bytes: usize,
    },
    /// Two tiers: `shm` within every node sums each rank's part of a chunk over the node,
    /// `across` sums that part between the nodes (over the ranks of the same local index, all
    /// node links busy at once), and `shm` hands the sums back. Buffers of at most
    /// [`LEADER_BYTES`](crate::allreduce::hierarchical::LEADER_BYTES) cross the network once,
    /// from each node's first rank. Needs the ranks of every node to share its memory. On one
    /// node it is `shm`, with one rank per node `across` alone.
    Hierarchical {
        /// The allreduce between the nodes.
        across: Across,
        /// Chunk per rank of the node stage, in bytes.
        chunk_bytes: usize,
    },
    /// The transport's MPI_Allreduce, in place on the caller's buffer (MPI transport only).
    Mpi,
    /// Chosen per call by the cost model from the buffer size and topology.
    Auto,
}

impl Algorithm {
    /// Names accepted by `FromStr`.
    pub const NAMES: [&'static str; 8] = [
        "ring",
        "rhd",
        "multicolor",
        "multiring",
        "shm",
        "hierarchical",
        "mpi",
        "auto",
    ];

    /// The multi-color algorithm with its default colors and chunk.
    pub const MULTICOLOR: Algorithm = Algorithm::Multicolor {
        colors: MULTICOLOR_COLORS,
        chunk_bytes: MULTICOLOR_CHUNK_BYTES,
    };

    /// The shared-memory algorithm with its default chunk.
    pub const SHM: Algorithm = Algorithm::Shm {
        chunk_bytes: SHM_CHUNK_BYTES,
    };

    /// The hierarchical algorithm with `across` between the nodes and its default chunk.
    pub const fn hierarchical(across: Across) -> Algorithm {
        Algorithm::Hierarchical {
            across,
            chunk_bytes: HIERARCHICAL_CHUNK_BYTES,
        }
    }

    /// The short name (`ring`, `rhd`, `multicolor`, `multiring`, `shm`, `hierarchical`,
    /// `mpi`, `auto`).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Rhd => "rhd",
            Algorithm::Multicolor { .. } => "multicolor",
            Algorithm::Multiring { .. } => "multiring",
            Algorithm::Shm { .. } => "shm",
            Algorithm::Hierarchical { .. } => "hierarchical",
            Algorithm::Mpi => "mpi",
            Algorithm::Auto => "auto",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::Multicolor {
                colors,
                chunk_bytes,
            } => write!(f, "multicolor:{colors}:{chunk_bytes}"),
            Algorithm::Multiring { dims, segments } if !dims.is_empty() || *segments > 0 => {
                let d: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                write!(f, "multiring:{}", d.join("x"))?;
                if *segments > 0 {
                    write!(f, ":{segments}")?;
                }
                Ok(())
            }
            Algorithm::Shm { chunk_bytes } if *self != Algorithm::SHM => {
                write!(f, "shm:{chunk_bytes}")
            }
            Algorithm::Hierarchical {
                across,
                chunk_bytes,
            } => {
                write!(f, "hierarchical:{}", across.algorithm().name())?;
                if *chunk_bytes != HIERARCHICAL_CHUNK_BYTES {
                    write!(f, ":{chunk_bytes}")?;
                }
                Ok(())
            }
            other => f.write_str(other.name()),
        }
    }
}

fn parse_usize(s: &str, what: &str) -> Result<usize, CommError> {
    s.parse::<usize>().ok().filter(|&v| v > 0).ok_or_else(|| {
        CommError::InvalidArgument(format!("{what} {s:?} is not a positive integer"))
    })
}

impl FromStr for Algorithm {
    type Err = CommError;

    /// Parses `ring`, `rhd`, `mpi`, `auto`, `shm[:CHUNK_BYTES]`,
    /// `hierarchical[:ring|rhd|mpi[:CHUNK_BYTES]]` (rhd between the nodes by default),
    /// `multicolor[:COLORS[:CHUNK_BYTES]]` and
    /// `multiring[:D1xD2x...[:SEGMENTS]]` (e.g. `multiring:4x8x8`, `multiring:4x2:8`, or
    /// `multiring::8` for the topology's dimensions in 8 segments).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().splitn(2, ':');
        let name = parts.next().unwrap_or("").to_ascii_lowercase();
        let rest = parts.next();
        match (name.as_str(), rest) {
            ("ring", None) => Ok(Algorithm::Ring),
            ("rhd", None) => Ok(Algorithm::Rhd),
            ("mpi", None) => Ok(Algorithm::Mpi),
            ("auto", None) => Ok(Algorithm::Auto),
            ("shm", None) => Ok(Algorithm::SHM),
            ("shm", Some(c)) => Ok(Algorithm::Shm {
                chunk_bytes: parse_usize(c, "chunk bytes")?,
            }),
            ("hierarchical", rest) => {
                let mut it = rest.unwrap_or("rhd").splitn(2, ':');
                let across = match it.next().unwrap_or("").to_ascii_lowercase().as_str() {
                    "ring" => Across::Ring,
                    "rhd" | "" => Across::Rhd,
                    "mpi" => Across::Mpi,
                    other => {
                        return Err(CommError::InvalidArgument(format!(
                            "hierarchical: {other:?} cannot run between the nodes (expected ring, rhd or mpi)"
                        )))
                    }
                };
                let chunk_bytes = match it.next() {
                    None => HIERARCHICAL_CHUNK_BYTES,
                    Some(c) => parse_usize(c, "chunk bytes")?,
                };
                Ok(Algorithm::Hierarchical {
                    across,
                    chunk_bytes,
                })
            }
            ("multicolor", rest) => {
                let mut colors = MULTICOLOR_COLORS;
                let mut chunk_bytes = MULTICOLOR_CHUNK_BYTES;
                if let Some(rest) = rest {
                    let mut it = rest.split(':');
                    if let Some(c) = it.next() {
                        colors = parse_usize(c, "color count")?;
                    }
                    if let Some(c) = it.next() {
                        chunk_bytes = parse_usize(c, "chunk bytes")?;
                    }
                }
                Ok(Algorithm::Multicolor {
                    colors,
                    chunk_bytes,
                })
            }
            ("multiring", rest) => {
                let mut it = rest.unwrap_or("").splitn(2, ':');
                let dims = match it.next() {
                    None | Some("") => Vec::new(),
                    Some(d) => d
                        .split('x')
                        .map(|v| parse_usize(v, "ring dimension"))
                        .collect::<Result<Vec<_>, _>>()?,
                };
                let segments = match it.next() {
                    None => 0,
                    Some(v) => parse_usize(v, "segment count")?,
                };
                Ok(Algorithm::Multiring { dims, segments })
            }
            _ => Err(CommError::InvalidArgument(format!(
                "unknown allreduce algorithm {s:?} (expected one of {})",
                Algorithm::NAMES.join(", ")
            ))),
        }
    }
}
