//! `ddl.dist`'s allgather and reduce-scatter (and the allreduce with `max` made of the two) on
//! raw tensor memory: ddl-comm's [`Sharded`] over the process's world, for a head split over
//! the ranks (`ddl.nn.ShardedLinearCrossEntropy`). The Python side passes a float32 tensor's
//! address, its element count and how many rows each rank owns; the call runs with the GIL
//! released.

use std::sync::Arc;

use ddl_comm::{Parts, Reduce, ShardAlgorithm, Sharded};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::dist::{dist, engine, slice, Dist};
use crate::errors::comm_error;

/// The allgather / reduce-scatter engine of `algorithm` (built on first use).
fn sharder(d: &Dist, algorithm: &str) -> PyResult<Arc<Sharded>> {
    engine(&d.sharders, algorithm, |parsed: ShardAlgorithm| {
        Sharded::new(
            d.world.transport(),
            parsed,
            d.world.topology(),
            d.model.clone(),
        )
    })
}

/// Runs `op` of `algorithm` on the `numel` float32 at `ptr` cut into `counts` rows per rank
/// (all rows as long), with the GIL released. Same contract as `allreduce`.
fn run_on(
    py: Python<'_>,
    (ptr, numel): (usize, usize),
    counts: &[usize],
    algorithm: &str,
    op: fn(&Sharded, &mut [f32], &Parts) -> ddl_comm::Result<()>,
) -> PyResult<()> {
    let d = dist()?;
    let s = sharder(&d, algorithm)?;
    let parts = parts(numel, counts)?;
    if numel == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract (see `allreduce`); the GIL is released but the tensor is
    // kept alive and unused by the Python caller until this returns.
    py.detach(|| op(&s, unsafe { slice(ptr, numel) }, &parts))
        .map_err(comm_error)
}

/// The parts of a buffer of `numel` elements whose rows (`counts[q]` of rank `q`) are all as
/// long.
fn parts(numel: usize, counts: &[usize]) -> PyResult<Parts> {
    let rows: usize = counts.iter().sum();
    if rows == 0 {
        return Ok(Parts::from_counts(counts));
    }
    if numel % rows != 0 {
        return Err(PyValueError::new_err(format!(
            "counts: {rows} rows in all do not divide the tensor's {numel} elements"
        )));
    }
    Ok(Parts::from_counts(counts).scaled(numel / rows))
}

/// Runs `op` on the `numel` float32 at `ptr`, cut into `counts[q]` rows for rank `q` (all rows
/// as long): `all_gather` fills every other rank's rows with that rank's; `reduce_scatter`
/// leaves in this rank's rows their sum over all ranks (the other rows undefined);
/// `allreduce_max` leaves everywhere the element-wise maximum over all ranks (`counts`
/// unused). Same contract as `allreduce`.
#[pyfunction]
pub fn sharded(
    py: Python<'_>,
    op: &str,
    ptr: usize,
    numel: usize,
    counts: Vec<usize>,
    algorithm: &str,
) -> PyResult<()> {
    let counts = if op == "allreduce_max" {
        vec![numel]
    } else {
        counts
    };
    let op = match op {
        "all_gather" => |s: &Sharded, buf: &mut [f32], parts: &Parts| s.all_gather(buf, parts),
        "reduce_scatter" => {
            |s: &Sharded, buf: &mut [f32], parts: &Parts| s.reduce_scatter(buf, parts, Reduce::Sum)
        }
        "allreduce_max" => |s: &Sharded, buf: &mut [f32], _: &Parts| s.allreduce_max(buf),
        other => {
            return Err(PyValueError::new_err(format!(
                "op: {other:?} is not all_gather, reduce_scatter or allreduce_max"
            )))
        }
    };
    run_on(py, (ptr, numel), &counts, algorithm, op)
}
