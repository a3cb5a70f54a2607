//! What an allreduce algorithm's file declares for the registry ([`crate::algorithm`]): its
//! name, what it parses from, its help line and whether `auto` may choose it ([`Declared`]),
//! and how its parameters parse and print and what runs them ([`Declare`]). As timely's
//! communication crate keeps a backend's builder in the backend's file, everything about one
//! algorithm lives in its file, and the registry only lists them.

use super::context::Allreduce;
use crate::error::{CommError, Result};
use crate::topology::Topology;

/// An allreduce algorithm as its file declares it: what help texts and lists of names are made
/// of ([`Algorithm::DECLARED`](crate::Algorithm::DECLARED)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    /// Its name, as it parses and prints.
    pub name: &'static str,
    /// What it parses from: the name and its parameters, e.g.
    /// `multicolor[:COLORS[:CHUNK_BYTES]]`.
    pub syntax: &'static str,
    /// What it does, in one line.
    pub help: &'static str,
    /// Whether `auto` may choose it (with its default parameters, where
    /// [`Declare::auto_here`] allows).
    pub auto: bool,
}

/// One algorithm's parameters, as its file declares them: the registry's line names the type
/// (a unit struct for an algorithm without parameters).
pub(crate) trait Declare: Default {
    /// Its name, syntax, help line and whether `auto` may choose it.
    const DECLARED: Declared;

    /// The parameters in what follows `name:` in [`Declared::syntax`] (`None`: the name
    /// alone, the defaults).
    fn parse(args: Option<&str>) -> Result<Self>;

    /// What follows `name:` when it prints (`None`: the name alone, which parses back to
    /// the defaults).
    fn args(&self) -> Option<String> {
        None
    }

    /// What runs it, not yet prepared.
    fn build(&self) -> Box<dyn Allreduce>;

    /// Whether `auto` may choose it over `topo`, where each node's ranks share its memory
    /// (`shared_memory`, or they were not probed yet) and the transport has its own allreduce
    /// (`native_allreduce`): [`Declared::auto`] unless where it runs is narrower.
    fn auto_here(topo: Topology, shared_memory: bool, native_allreduce: bool) -> bool {
        let _ = (topo, shared_memory, native_allreduce);
        Self::DECLARED.auto
    }
}

/// The parameters of an algorithm that takes none: `Ok` for the name alone.
pub(crate) fn no_args(declared: &Declared, args: Option<&str>) -> Result<()> {
    match args {
        None => Ok(()),
        Some(args) => Err(CommError::InvalidArgument(format!(
            "allreduce algorithm {:?} takes no parameters, got {:?}",
            declared.name, args
        ))),
    }
}

/// A parameter that must be a positive integer (`what` names it in the error).
pub(crate) fn positive(s: &str, what: &str) -> Result<usize> {
    s.parse::<usize>().ok().filter(|&v| v > 0).ok_or_else(|| {
        CommError::InvalidArgument(format!("{what} {s:?} is not a positive integer"))
    })
}
