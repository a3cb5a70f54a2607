//! `mpi` ([`crate::Algorithm::Mpi`]): the transport's MPI_Allreduce, in place on the caller's
//! buffer (MPI transport only), and its cost where it was not measured.

use super::call_check::check_calls;
use super::context::{Allreduce, Context};
use super::declare::{no_args, Declare, Declared};
use super::element::{with_elements, Buffer};
use super::messages::in_f32;
use super::signature::Signature;
use crate::cost::{open_mpi_choice, CostModel, OpenMpiAllreduce};
use crate::error::{CommError, Result};
use crate::topology::Topology;

/// MPI_Allreduce. MPI has no half-precision types: f16 / bf16 go through it widened to f32
/// block by block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mpi;

impl Declare for Mpi {
    const DECLARED: Declared = Declared {
        name: "mpi",
        syntax: "mpi",
        help: "the transport's MPI_Allreduce, in place (MPI transport only)",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Mpi> {
        no_args(&Self::DECLARED, args).map(|()| Mpi)
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(Mpi)
    }

    /// Only over MPI.
    fn auto_here(_: Topology, _: bool, native_allreduce: bool) -> bool {
        native_allreduce
    }
}

impl Allreduce for Mpi {
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        if !cx.transport.has_native_allreduce() {
            return Err(CommError::Unsupported(
                "the mpi algorithm needs the MPI transport".into(),
            ));
        }
        Ok(())
    }

    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let t = &*cx.transport;
        if let Some(mine) = check {
            check_calls(t, mine, true)?;
        }
        let (p, run) = (t.size(), |f: &mut [f32]| t.native_allreduce_f32(f));
        match buf {
            // Straight to MPI_Allreduce: no buffer to widen, so no lock to take.
            Buffer::F32(f) => in_f32(f, &mut Vec::new(), average, p, run),
            half => {
                let mut work = cx.work.lock().unwrap_or_else(|e| e.into_inner());
                with_elements!(half, b => in_f32(b, &mut work.widened, average, p, run))
            }
        }
    }

    /// The rounds of what Open MPI 4.1's `tuned` component runs for a sum of floats
    /// ([`open_mpi_choice`]).
    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        let (p, n) = (topo.ranks(), bytes as f64);
        match open_mpi_choice(p, bytes) {
            OpenMpiAllreduce::RecursiveDoubling => model.recursive_time(n, topo, false),
            OpenMpiAllreduce::Ring => model.multiring_time(&[p], 1, n, topo),
        }
    }
}
