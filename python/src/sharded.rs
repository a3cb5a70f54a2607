//! `ddl.dist`'s allgather and reduce-scatter (and the allreduce with `max` made of the two) on
//! raw tensor memory: ddl-comm's [`Sharded`] over the process's world, for a head split over
//! the ranks (`ddl.nn.ShardedLinearCrossEntropy`). The Python side passes a float32 tensor's
//! address, its element count and how many rows each rank owns; the call runs with the GIL
//! released.

use std::sync::Arc;

use ddl_comm::collective::allgather_bytes;
use ddl_comm::{Parts, Reduce, ShardAlgorithm, Sharded};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::dist::{dist, engine, size_mismatch, slice, Dist};
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
    name: &str,
    (ptr, numel): (usize, usize),
    counts: &[usize],
    algorithm: &str,
    op: fn(&Sharded, &mut [f32], &Parts) -> ddl_comm::Result<()>,
) -> PyResult<()> {
    let d = dist()?;
    let s = sharder(&d, algorithm)?;
    py.detach(|| {
        agree_on_shape(&d, name, numel, counts)?;
        // The same on every rank now: a bad cut fails on all of them.
        let parts = parts(numel, counts)?;
        if numel == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract (see `allreduce`); the GIL is released but the tensor
        // is kept alive and unused by the Python caller until this returns.
        op(&s, unsafe { slice(ptr, numel) }, &parts).map_err(comm_error)
    })
}

/// A word for a call of `numel` elements in `counts` rows per rank (FNV-1a over them).
fn shape_word(numel: usize, counts: &[usize]) -> u64 {
    std::iter::once(numel)
        .chain(counts.iter().copied())
        .flat_map(|v| (v as u64).to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Compares the ranks' `numel` and `counts` before any data moves (one word per rank): ranks
/// that differ would otherwise fail on some ranks only, or truncate a message under MPI. A
/// DistError on every rank naming each rank's element count and rows when they differ.
fn agree_on_shape(d: &Dist, op: &str, numel: usize, counts: &[usize]) -> PyResult<()> {
    let t = d.world.transport();
    if t.size() == 1 {
        return Ok(());
    }
    let mut words = vec![0u64; t.size()];
    t.allgather_u64(shape_word(numel, counts), &mut words)
        .map_err(comm_error)?;
    if words.iter().all(|w| *w == words[0]) {
        return Ok(());
    }
    // They differ: every rank learns what each passed, to name it.
    let mine = format!("{numel} elements in rows {counts:?}");
    let all = allgather_bytes(&*t, mine.into_bytes()).map_err(comm_error)?;
    Err(size_mismatch(
        op,
        t.rank(),
        all.iter()
            .map(|b| format!("passed {}", String::from_utf8_lossy(b))),
        "every rank must pass the same tensor shape and counts",
    ))
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
    let name = match op {
        "all_gather" => "all_gather_",
        "reduce_scatter" => "reduce_scatter_",
        _ => "allreduce_max",
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
    run_on(py, name, (ptr, numel), &counts, algorithm, op)
}
