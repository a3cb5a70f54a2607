//! `ddl.dist.DistributedOptimizer(comm_order="priority")`'s schedule: ddl-comm's
//! [`Negotiator`] (the lowest-priority-number bucket first, in chunks, each agreed on by every
//! rank with one small allreduce) over this process's world. Python hands buckets over and
//! reduces the chunks the negotiation returns; which chunk comes next is decided here.

use std::sync::Mutex;

use ddl_comm::priority::{Decision, Local, Negotiator};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::dist::{dist, reducer};
use crate::errors::comm_error;

/// The decision of a round as Python sees it: `(kind, bucket, start, end, last)` with kind
/// "chunk", "exit" or "wait" (the other fields 0 / false unless a chunk).
type Round = (&'static str, usize, usize, usize, bool);

/// One rank's view of a priority schedule (see the module doc).
#[pyclass(module = "ddl._ddl", name = "Negotiator")]
pub struct PyNegotiator {
    inner: Mutex<Negotiator>,
    algorithm: String,
}

fn round(d: Decision) -> Round {
    match d {
        Decision::Chunk {
            bucket,
            range,
            last,
        } => ("chunk", bucket, range.start, range.end, last),
        Decision::Exit => ("exit", 0, 0, 0, false),
        // Python offers no exchange, so no round agrees on one.
        Decision::Wait | Decision::Exchange => ("wait", 0, 0, 0, false),
    }
}

#[pymethods]
impl PyNegotiator {
    /// `buckets`: `(priority, elements)` per bucket (lower priority numbers go first), cut
    /// into chunks of `chunk` elements; the rounds allreduce with `algorithm`.
    #[new]
    fn new(buckets: Vec<(usize, usize)>, chunk: usize, algorithm: &str) -> PyResult<Self> {
        if chunk == 0 {
            return Err(PyValueError::new_err("chunk: must be at least one element"));
        }
        reducer(&*dist()?, algorithm)?;
        Ok(PyNegotiator {
            inner: Mutex::new(Negotiator::new(buckets, chunk)),
            algorithm: algorithm.to_string(),
        })
    }

    /// Bucket `bucket` is handed over on this rank.
    fn ready(&self, bucket: usize) -> PyResult<()> {
        let mut n = self.lock();
        if bucket >= n.buckets() {
            return Err(PyValueError::new_err(format!(
                "bucket: {bucket} is not one of the {} buckets",
                n.buckets()
            )));
        }
        n.ready(bucket);
        Ok(())
    }

    /// Whether a bucket handed over here is not complete yet.
    fn any_ready(&self) -> bool {
        self.lock().any_ready()
    }

    /// One round with every rank (collective; `done`: this rank handed its whole step over);
    /// a chunk it returns is taken and must be reduced next.
    fn negotiate(&self, py: Python<'_>, done: bool) -> PyResult<Round> {
        let d = dist()?;
        let r = reducer(&d, &self.algorithm)?;
        let ranks = d.world.transport().size();
        let local = Local {
            done,
            exchange: false,
        };
        let decision = py
            .detach(|| {
                self.lock()
                    .negotiate(local, ranks, |s| r.allreduce_f32(s, false))
            })
            .map_err(comm_error)?;
        Ok(round(decision))
    }

    /// The rest of the highest-priority bucket ready here, whole, without a round (every rank
    /// holds every bucket it has not completed: after an exit), or `None`.
    fn next_rest(&self) -> Option<Round> {
        self.lock().next_rest().map(round)
    }
}

impl PyNegotiator {
    fn lock(&self) -> std::sync::MutexGuard<'_, Negotiator> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
