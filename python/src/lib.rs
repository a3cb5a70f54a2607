//! The extension module `ddl._ddl` behind the Python package `ddl`: the pipeline
//! ([`loader::Loader`]) and its record trace ([`trace_records::TraceRecords`]), map-style shard
//! access ([`shards::Shards`]) and the allreduce
//! ([`dist`]) with the allgather and reduce-scatter ([`sharded`]) and the `priority` order's
//! negotiation ([`priority`]). Importing it starts nothing: the job's transport starts in
//! `dist_init` (MPI) or `dist_init_tcp` (TCP).

#![warn(missing_docs)]

mod backend;
mod batch;
mod dist;
mod errors;
mod loader;
mod priority;
mod sharded;
mod shards;
mod trace_records;

use pyo3::prelude::*;

/// The module `ddl._ddl`.
#[pymodule]
fn _ddl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<loader::Loader>()?;
    m.add_class::<shards::Shards>()?;
    m.add_class::<trace_records::TraceRecords>()?;
    m.add_class::<batch::BatchArray>()?;
    m.add_class::<priority::PyNegotiator>()?;
    m.add("DdlError", py.get_type::<errors::DdlError>())?;
    m.add("ShardError", py.get_type::<errors::ShardError>())?;
    m.add("DistError", py.get_type::<errors::DistError>())?;
    m.add("ALGORITHMS", dist::algorithm_names())?;
    m.add("ALGORITHM_HELP", dist::algorithm_help())?;
    m.add("SHARD_ALGORITHMS", dist::shard_algorithm_names())?;
    m.add_function(wrap_pyfunction!(dist::dist_init, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_listen, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_init_tcp, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_backend, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_require, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_finalize, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_info, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_resolve, m)?)?;
    m.add_function(wrap_pyfunction!(dist::dist_binding_warning, m)?)?;
    m.add_function(wrap_pyfunction!(dist::allreduce, m)?)?;
    m.add_function(wrap_pyfunction!(dist::broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(sharded::sharded, m)?)?;
    m.add_function(wrap_pyfunction!(dist::barrier, m)?)?;
    m.add_function(wrap_pyfunction!(dist::abort, m)?)?;
    Ok(())
}
