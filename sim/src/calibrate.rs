//! `ddl-bench calibrate`'s measurement: ddl-comm's calibration of the [`CostModel`], then,
//! for CPU replicas, the [`Contention`] of compute and communication on the same cores.

use std::sync::Arc;

use ddl_comm::calibrate::calibration_iters;
use ddl_comm::collective::broadcast_bytes;
use ddl_comm::mpi::Polling;
use ddl_comm::{Allreducer, CostModel, Result, Topology, Transport, World};

use crate::contention::{self, Contention};
use crate::model::StepModel;

/// The allreduce the contention is measured with: a bucket's size (ddl-train's are 25 MiB at
/// most, cut at stage boundaries).
const CONTENTION_BYTES: usize = 16 << 20;

/// Measures the cost model under MPI ([`ddl_comm::calibrate::calibrate`] with `max_bytes`
/// and `passes`) and, with `compute_threads` (stand-ins for each rank's CPU replicas, 0 for
/// none), the [`Contention`] of the compute and `auto`'s allreduces of a bucket's size and of
/// a negotiation round's on the same cores (at most 3 passes). Every rank must call this;
/// rank 0 gets the figures.
pub fn calibrate(
    world: &World,
    max_bytes: usize,
    passes: usize,
    compute_threads: usize,
) -> Result<StepModel> {
    let cost = ddl_comm::calibrate::calibrate(world, max_bytes, passes)?;
    if compute_threads == 0 {
        return Ok(StepModel::separate(cost));
    }
    let contention = measure_contention(world, &cost, max_bytes, passes, compute_threads)?;
    Ok(StepModel { cost, contention })
}

/// The contention of `compute_threads` per rank and the allreduces `cost` picks, as
/// [`calibrate`] measures it.
fn measure_contention(
    world: &World,
    cost: &CostModel,
    max_bytes: usize,
    passes: usize,
    compute_threads: usize,
) -> Result<Contention> {
    let t: Arc<dyn Transport> = world.transport();
    let topo = world.topology();
    // As ddl-train with as many CPU replicas per rank waits.
    world.share_cores(compute_threads);
    let bytes = CONTENTION_BYTES.min(max_bytes).max(4);
    let ar = chosen_allreducer(&t, cost, bytes, topo)?;
    let round = chosen_allreducer(&t, cost, contention::ROUND_BYTES, topo)?;
    let yield_to_comm = world.polling() == Polling::Backoff;
    contention::measure(
        &*t,
        [&ar, &round],
        bytes,
        calibration_iters(bytes),
        compute_threads,
        yield_to_comm,
        passes.min(3),
    )
}

/// The allreducer of what `model` picks at `bytes` on rank 0, which holds the times: every
/// rank runs rank 0's choice.
fn chosen_allreducer(
    t: &Arc<dyn Transport>,
    model: &CostModel,
    bytes: usize,
    topo: Topology,
) -> Result<Allreducer> {
    let chosen = model.choose(bytes, topo).to_string().into_bytes();
    let chosen = String::from_utf8_lossy(&broadcast_bytes(&**t, chosen)?).into_owned();
    Allreducer::new(t.clone(), chosen.parse()?, topo)
}
