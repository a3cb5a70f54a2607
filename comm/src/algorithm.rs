//! The registry of allreduce algorithms: one line each, naming the [`Algorithm`] variant and
//! the type its file declares ([`Declare`]: its name, what it parses from, its help line,
//! whether `auto` may choose it, what runs it). Everything else about an algorithm lives in
//! its file under [`crate::allreduce`]; every list of names (help texts, `ddl.dist`, the
//! candidates of `auto`) is made from this one. Adding an algorithm is its file and a line
//! here.
//!
//! `auto` is the registry's own: it chooses among the others per call, so the registry
//! declares it, and [`crate::allreduce::Allreducer`] runs it over them.

use std::fmt;
use std::str::FromStr;

use crate::allreduce::context::Allreduce;
use crate::allreduce::declare::{no_args, Declare, Declared};
use crate::allreduce::hierarchical::{self, Across, Hierarchical};
use crate::allreduce::multicolor::{self, Multicolor};
use crate::allreduce::multiring;
use crate::allreduce::shm::{self, Shm};
use crate::allreduce::{mpi, rhd, ring};
use crate::error::{CommError, Result};
use crate::topology::Topology;

/// What `auto` declares: the registry's choice among the algorithms that let it choose them.
const AUTO: Declared = Declared {
    name: "auto",
    syntax: "auto",
    help: "the fastest of the others that let auto choose them, per buffer size: timed on \
           the first calls of each size, or as a measured cost model has them",
    auto: false,
};

/// An algorithm's parameters seen through its [`Declare`] implementation.
trait Registered {
    fn declared(&self) -> &'static Declared;
    fn args(&self) -> Option<String>;
    fn build(&self) -> Box<dyn Allreduce>;
}

impl<D: Declare> Registered for D {
    fn declared(&self) -> &'static Declared {
        &D::DECLARED
    }
    fn args(&self) -> Option<String> {
        Declare::args(self)
    }
    fn build(&self) -> Box<dyn Allreduce> {
        Declare::build(self)
    }
}

/// Makes [`Algorithm`] and what is derived from the list: each line is `Variant: file::Type`
/// (an algorithm without parameters, `Type` a unit struct) or `Variant(file::Type)` (the
/// variant carries its parameters), in the order `auto` tries them.
macro_rules! registry {
    ($($variant:ident $(($pfile:ident::$pty:ident))? $(: $ufile:ident::$uty:ident)?,)*) => {
        /// An allreduce algorithm with its parameters: one of the registry's
        /// ([`Algorithm::DECLARED`] lists them with their help), or `auto`.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Algorithm {
            $(
                #[doc = concat!("`", stringify!($($pfile)? $($ufile)?),
                                "`: declared in `comm/src/allreduce/",
                                stringify!($($pfile)? $($ufile)?), ".rs`.")]
                $variant $(($pfile::$pty))?,
            )*
            /// Chosen per call among the others ([`auto_candidates`]).
            Auto,
        }

        impl Algorithm {
            /// Every algorithm as its file declares it, in the registry's order, `auto` last.
            pub const DECLARED: &'static [Declared] =
                &[$(<$($pfile::$pty)? $($ufile::$uty)? as Declare>::DECLARED,)* AUTO];

            /// Its parameters, `None` for `auto`.
            fn registered(&self) -> Option<&dyn Registered> {
                match self {
                    $(registry!(@pattern $variant p $($pty)?) =>
                        Some(registry!(@value p $($pty)?; $($ufile::$uty)?)),)*
                    Algorithm::Auto => None,
                }
            }

            /// The algorithm `name` names, with the parameters in `args` (what followed `:`).
            fn parse(name: &str, args: Option<&str>) -> Result<Option<Algorithm>> {
                $(if name == <$($pfile::$pty)? $($ufile::$uty)? as Declare>::DECLARED.name {
                    let params = <$($pfile::$pty)? $($ufile::$uty)? as Declare>::parse(args)?;
                    return Ok(Some(registry!(@wrap $variant params $($pty)?)));
                })*
                Ok(None)
            }
        }

        /// The algorithms `auto` chooses between over `topo`, with their default parameters:
        /// those that declare that `auto` may choose them ([`Declared::auto`]), where each
        /// says it may: `shm` where all ranks are on one node and `hierarchical` where several
        /// nodes hold several ranks each, both only where `shared_memory` (each node's ranks
        /// were found to share its memory, or have not been probed yet); `mpi` only where
        /// `native_allreduce` (the transport is MPI's). When `auto` runs `mpi` it blocks in
        /// MPI_Allreduce without ddl's operation timeout: a rank that dies still ends the job
        /// through mpirun (Open MPI's default), but one that stalls alive stalls the others,
        /// where the other algorithms fail after the timeout naming it.
        pub fn auto_candidates(
            topo: Topology,
            shared_memory: bool,
            native_allreduce: bool,
        ) -> Vec<Algorithm> {
            let mut candidates = Vec::new();
            $(if <$($pfile::$pty)? $($ufile::$uty)? as Declare>::auto_here(
                topo,
                shared_memory,
                native_allreduce,
            ) {
                let params = <$($pfile::$pty)? $($ufile::$uty)?>::default();
                candidates.push(registry!(@wrap $variant params $($pty)?));
            })*
            candidates
        }
    };
    (@pattern $variant:ident $p:ident) => { Algorithm::$variant };
    (@pattern $variant:ident $p:ident $ty:ident) => { Algorithm::$variant($p) };
    (@value $p:ident $ty:ident;) => { $p };
    (@value $p:ident; $file:ident::$ty:ident) => { &$file::$ty };
    (@wrap $variant:ident $params:ident) => {{ let _ = $params; Algorithm::$variant }};
    (@wrap $variant:ident $params:ident $ty:ident) => { Algorithm::$variant($params) };
}

registry! {
    Ring: ring::Ring,
    Rhd: rhd::Rhd,
    Multiring(multiring::Multiring),
    Multicolor(multicolor::Multicolor),
    Shm(shm::Shm),
    Hierarchical(hierarchical::Hierarchical),
    Mpi: mpi::Mpi,
}

impl Algorithm {
    /// The multi-color algorithm with its default colors and chunk.
    pub const MULTICOLOR: Algorithm = Algorithm::Multicolor(Multicolor::DEFAULT);

    /// The shared-memory algorithm with its default chunk.
    pub const SHM: Algorithm = Algorithm::Shm(Shm::DEFAULT);

    /// The hierarchical algorithm with `across` between the nodes and its default chunk.
    pub const fn hierarchical(across: Across) -> Algorithm {
        Algorithm::Hierarchical(Hierarchical {
            across,
            chunk_bytes: Hierarchical::DEFAULT.chunk_bytes,
        })
    }

    /// The names of [`Algorithm::DECLARED`], in its order (`auto` last).
    pub fn names() -> impl Iterator<Item = &'static str> {
        Algorithm::DECLARED.iter().map(|d| d.name)
    }

    /// Every algorithm's syntax and help line, one line each in the registry's order (`auto`
    /// last): the list of choices of a help text.
    pub fn help() -> String {
        let lines: Vec<String> = Algorithm::DECLARED
            .iter()
            .map(|d| format!("{}: {}", d.syntax, d.help))
            .collect();
        lines.join("\n")
    }

    /// What its file declares (the registry declares `auto`).
    pub fn declared(&self) -> &'static Declared {
        self.registered().map_or(&AUTO, Registered::declared)
    }

    /// Its name (`ring`, `rhd`, ..., `auto`: [`Algorithm::DECLARED`]).
    pub fn name(&self) -> &'static str {
        self.declared().name
    }

    /// What runs it, not yet prepared; `None` for `auto`, which runs the others
    /// ([`crate::allreduce::Allreducer`] makes it).
    pub(crate) fn implement(&self) -> Option<Box<dyn Allreduce>> {
        self.registered().map(Registered::build)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.registered().and_then(Registered::args) {
            Some(args) => write!(f, "{}:{args}", self.name()),
            None => f.write_str(self.name()),
        }
    }
}

impl FromStr for Algorithm {
    type Err = CommError;

    /// Parses a name of [`Algorithm::DECLARED`], in any case, with the parameters its syntax
    /// allows after a `:` (e.g. `multiring:4x8x8`, `hierarchical:mpi`, `shm:65536`).
    fn from_str(s: &str) -> Result<Self> {
        let (name, args) = match s.trim().split_once(':') {
            Some((name, args)) => (name, Some(args)),
            None => (s.trim(), None),
        };
        let name = name.to_ascii_lowercase();
        if name == AUTO.name {
            return no_args(&AUTO, args).map(|()| Algorithm::Auto);
        }
        Algorithm::parse(&name, args)?.ok_or_else(|| {
            let names: Vec<&str> = Algorithm::names().collect();
            CommError::InvalidArgument(format!(
                "unknown allreduce algorithm {s:?} (expected one of {})",
                names.join(", ")
            ))
        })
    }
}
