//! `ddl.dist`'s engine: the job of this process (MPI or TCP, one per process, started on demand) and
//! ddl's allreduce on raw tensor memory. The Python side passes a tensor's address, element
//! count and dtype; the reduction runs with the GIL released.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ddl_comm::collective::{allgather_bytes, broadcast_bytes_from};
use ddl_comm::{
    bf16, f16, Algorithm, Allreducer, CostModel, Listener, Secret, ShardAlgorithm, TcpWorld, World,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::backend::Backend;
use crate::errors::{comm_error, DistError};

/// The process's job and its allreducers and allgather / reduce-scatter engines, one per
/// algorithm name.
pub(crate) struct Dist {
    pub(crate) world: Backend,
    /// The cost model `auto` chooses with (from `init(cost_model=...)`, else the default).
    pub(crate) model: CostModel,
    pub(crate) reducers: Mutex<HashMap<String, Arc<Allreducer>>>,
    pub(crate) sharders: Mutex<HashMap<String, Arc<ddl_comm::Sharded>>>,
    /// Whether the ranks have compared the algorithm names of their first allreduce (and
    /// found them the same).
    algorithms_agreed: AtomicBool,
}

/// The process's world once `dist_init` ran; taken again by `dist_finalize`.
static DIST: Mutex<State> = Mutex::new(State::Uninitialised);

/// Where the process is in MPI's life: MPI can be started once and never restarted.
enum State {
    Uninitialised,
    Running(Arc<Dist>),
    Finalised,
}

fn state() -> MutexGuard<'static, State> {
    DIST.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn dist() -> PyResult<Arc<Dist>> {
    match &*state() {
        State::Running(d) => Ok(Arc::clone(d)),
        State::Uninitialised => Err(PyRuntimeError::new_err(
            "ddl.dist is not initialised: call ddl.dist.init() first",
        )),
        State::Finalised => Err(PyRuntimeError::new_err(SHUT_DOWN)),
    }
}

/// Why nothing runs after `dist_finalize` (at interpreter exit, or a call to it).
const SHUT_DOWN: &str = "ddl.dist was shut down in this process (at interpreter exit); it \
     cannot be used or initialised again: make every call before the interpreter exits";

/// Raises the RuntimeError saying why ddl.dist cannot be used (never initialised, or shut
/// down) unless it runs.
#[pyfunction]
pub fn dist_require() -> PyResult<()> {
    dist().map(drop)
}

/// The names of the allreduce algorithms (`ddl.dist.ALGORITHMS`), `auto` first.
pub fn algorithm_names() -> Vec<&'static str> {
    auto_first(&Algorithm::names().collect::<Vec<_>>())
}

/// Each allreduce algorithm's name, syntax and help line (`ddl.dist.ALGORITHM_HELP`), in the
/// order of [`algorithm_names`].
pub fn algorithm_help() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut declared: Vec<_> = Algorithm::DECLARED
        .iter()
        .map(|d| (d.name, d.syntax, d.help))
        .collect();
    declared.sort_by_key(|(name, _, _)| *name != "auto");
    declared
}

/// The names of the allgather / reduce-scatter algorithms (`ddl.dist.SHARD_ALGORITHMS`),
/// `auto` first.
pub fn shard_algorithm_names() -> Vec<&'static str> {
    auto_first(&ShardAlgorithm::NAMES)
}

/// `names` with `auto` moved to the front (the order of the rest kept).
fn auto_first(names: &[&'static str]) -> Vec<&'static str> {
    let mut names = names.to_vec();
    names.sort_by_key(|n| *n != "auto");
    names
}

/// The cost model in the file `cost_model` (written by `ddl-bench calibrate`), or the default.
fn model(cost_model: Option<PathBuf>) -> PyResult<CostModel> {
    match &cost_model {
        Some(path) => CostModel::load(path).map_err(|e| PyValueError::new_err(e.to_string())),
        None => Ok(CostModel::default()),
    }
}

fn check_timeout(timeout: f64) -> PyResult<Duration> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(PyValueError::new_err(format!(
            "timeout: must be a positive number of seconds, got {timeout}"
        )));
    }
    Ok(Duration::from_secs_f64(timeout))
}

/// Starts the job with `start` unless it runs already (then returns at once).
fn start(model: CostModel, start: impl FnOnce() -> PyResult<Backend>) -> PyResult<()> {
    let mut s = state();
    match &*s {
        State::Running(_) => return Ok(()),
        State::Finalised => return Err(PyRuntimeError::new_err(SHUT_DOWN)),
        State::Uninitialised => {}
    }
    *s = State::Running(Arc::new(Dist {
        world: start()?,
        model,
        reducers: Mutex::new(HashMap::new()),
        sharders: Mutex::new(HashMap::new()),
        algorithms_agreed: AtomicBool::new(false),
    }));
    Ok(())
}

/// Starts MPI (or joins an MPI already started, e.g. by mpi4py) once per process; later calls
/// return at once. Blocking operations fail after `timeout` seconds; `auto` chooses with the
/// cost model in the file `cost_model` (written by `ddl-bench calibrate`), if given.
#[pyfunction]
#[pyo3(signature = (timeout, cost_model=None))]
pub fn dist_init(py: Python<'_>, timeout: f64, cost_model: Option<PathBuf>) -> PyResult<()> {
    let timeout = check_timeout(timeout)?;
    let model = model(cost_model)?;
    py.detach(|| {
        start(model, || {
            World::init_with_timeout(timeout)
                .map(Backend::Mpi)
                .map_err(comm_error)
        })
    })
}

/// This rank's listener of the TCP backend, bound by `dist_listen` before the ranks exchange
/// addresses and taken by `dist_init_tcp`.
static LISTENER: Mutex<Option<Listener>> = Mutex::new(None);

/// Binds this rank's TCP listener on `host` and returns its address (`ip:port`), which the
/// caller publishes to the other ranks.
#[pyfunction]
pub fn dist_listen(host: &str) -> PyResult<String> {
    let l = Listener::bind(host).map_err(comm_error)?;
    let addr = l.local_addr().map_err(comm_error)?.to_string();
    *LISTENER.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
    Ok(addr)
}

/// Connects rank `rank` to the ranks listening at `addrs` (ddl's TCP transport, no MPI), the
/// ranks stating the same `node` forming a node; every connection proves that both ends hold
/// `secret` (the job's random bytes from the rendezvous store); otherwise as [`dist_init`].
#[pyfunction]
#[pyo3(signature = (timeout, cost_model, rank, addrs, node, secret))]
pub fn dist_init_tcp(
    py: Python<'_>,
    timeout: f64,
    cost_model: Option<PathBuf>,
    rank: usize,
    addrs: Vec<String>,
    node: &str,
    secret: &[u8],
) -> PyResult<()> {
    let timeout = check_timeout(timeout)?;
    let secret = Secret::new(secret).map_err(comm_error)?;
    let model = model(cost_model)?;
    let addrs = addrs
        .iter()
        .enumerate()
        .map(|(r, a)| {
            a.parse().map_err(|e| {
                PyValueError::new_err(format!("rank {r} published the address {a:?}: {e}"))
            })
        })
        .collect::<PyResult<Vec<std::net::SocketAddr>>>()?;
    let listener = LISTENER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| PyRuntimeError::new_err("dist_init_tcp: call dist_listen first"))?;
    py.detach(|| {
        start(model, || {
            TcpWorld::connect(listener, rank, &addrs, &secret, node, timeout)
                .map(Backend::Tcp)
                .map_err(comm_error)
        })
    })
}

/// `"mpi"` or `"tcp"`: the transport of the running job.
#[pyfunction]
pub fn dist_backend() -> PyResult<&'static str> {
    Ok(dist()?.world.name())
}

/// Releases ddl's communicators and finalises MPI if ddl started it (run at interpreter exit,
/// after the communication thread has stopped).
#[pyfunction]
pub fn dist_finalize(py: Python<'_>) {
    let taken = std::mem::replace(&mut *state(), State::Finalised);
    py.detach(move || drop(taken));
}

/// Whether `dist_init` has run in this process.
#[pyfunction]
pub fn dist_initialized() -> bool {
    matches!(&*state(), State::Running(_))
}

/// `(rank, size, local_rank, local_size, node, nodes, joined)` of this process.
#[pyfunction]
pub fn dist_info() -> PyResult<(usize, usize, usize, usize, usize, usize, bool)> {
    let d = dist()?;
    let (rank, size, local_rank, local_size, node, nodes) = d.world.place();
    Ok((
        rank,
        size,
        local_rank,
        local_size,
        node,
        nodes,
        d.world.joined(),
    ))
}

/// The launcher-binding warning of this rank for `threads` busy threads (decode workers and
/// training), or `None` when its node's ranks have the cores they need ([`ddl_comm::Binding`]).
#[pyfunction]
pub fn dist_binding_warning(threads: usize) -> PyResult<Option<String>> {
    Ok(dist()?.world.binding().warning(threads))
}

/// The engine of `algorithm` in `map`, built by `build` over the world on first use
/// (construction is local).
pub(crate) fn engine<T, A>(
    map: &Mutex<HashMap<String, Arc<T>>>,
    algorithm: &str,
    build: impl FnOnce(A) -> ddl_comm::Result<T>,
) -> PyResult<Arc<T>>
where
    A: std::str::FromStr<Err = ddl_comm::CommError>,
{
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = map.get(algorithm) {
        return Ok(Arc::clone(r));
    }
    let bad =
        |e: ddl_comm::CommError| PyValueError::new_err(format!("algorithm {algorithm:?}: {e}"));
    let r = Arc::new(build(algorithm.parse().map_err(bad)?).map_err(bad)?);
    map.insert(algorithm.to_string(), Arc::clone(&r));
    Ok(r)
}

/// The allreducer of `algorithm` (built on first use).
pub(crate) fn reducer(d: &Dist, algorithm: &str) -> PyResult<Arc<Allreducer>> {
    engine(&d.reducers, algorithm, |parsed: Algorithm| {
        Allreducer::with_model(
            d.world.transport(),
            parsed,
            d.world.topology(),
            d.model.clone(),
        )
    })
}

/// The algorithm that `algorithm` runs for a buffer of `nbytes` bytes of f32 (what `auto`
/// picks there; another name is itself, parameters printed).
#[pyfunction]
pub fn dist_resolve(algorithm: &str, nbytes: usize) -> PyResult<String> {
    let d = dist()?;
    Ok(reducer(&d, algorithm)?.resolve(nbytes).to_string())
}

/// Sums `numel` elements of `dtype` ("float32", "float16", "bfloat16") at host address `ptr`
/// over all ranks, in place; with `average`, divides by the rank count.
///
/// The caller guarantees that `ptr` points to `numel` contiguous, writable elements that stay
/// alive and untouched until this returns (`ddl.dist` passes a contiguous CPU tensor's
/// `data_ptr()`).
#[pyfunction]
pub fn allreduce(
    py: Python<'_>,
    ptr: usize,
    numel: usize,
    dtype: &str,
    average: bool,
    algorithm: &str,
) -> PyResult<()> {
    let d = dist()?;
    let r = reducer(&d, algorithm)?;
    if ptr == 0 && numel > 0 {
        return Err(PyValueError::new_err("tensor: null data pointer"));
    }
    if !d.algorithms_agreed.load(Ordering::Relaxed) {
        py.detach(|| agree_on_algorithm(&d, algorithm))?;
    }
    // An empty tensor still takes part in the call: the ranks compare their element counts
    // and types, and a rank of another count must not wait alone.
    let result = match dtype {
        // SAFETY: the caller's contract above; the GIL is released but the tensor is kept
        // alive and unused by the Python caller until this returns.
        "float32" => py.detach(|| r.allreduce_f32(unsafe { slice(ptr, numel) }, average)),
        "float16" => py.detach(|| r.allreduce::<f16>(unsafe { slice(ptr, numel) }, average)),
        "bfloat16" => py.detach(|| r.allreduce::<bf16>(unsafe { slice(ptr, numel) }, average)),
        other => {
            return Err(PyValueError::new_err(format!(
                "tensor dtype {other} is not float32, float16 or bfloat16"
            )))
        }
    };
    result.map_err(comm_error)
}

/// On the first allreduce (every rank's first, the same call): compares the ranks'
/// algorithm names, which would otherwise wait for each other's messages in different places
/// until the timeout. A DistError naming each rank's choice when they differ (compared again
/// at the next call).
fn agree_on_algorithm(d: &Dist, algorithm: &str) -> PyResult<()> {
    let t = d.world.transport();
    let names = allgather_bytes(&*t, algorithm.as_bytes().to_vec()).map_err(comm_error)?;
    if names.iter().any(|n| n != algorithm.as_bytes()) {
        let each: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(r, n)| format!("rank {r} {:?}", String::from_utf8_lossy(n)))
            .collect();
        return Err(DistError::new_err(format!(
            "allreduce on rank {}: the ranks chose different algorithms: {} (pass the same \
             algorithm on every rank)",
            t.rank(),
            each.join(", ")
        )));
    }
    d.algorithms_agreed.store(true, Ordering::Relaxed);
    Ok(())
}

/// The DistError of `op` on rank `me` when the ranks passed tensors of different sizes:
/// `each` says what each rank passed, in rank order; `fix` what to do.
pub(crate) fn size_mismatch(
    op: &str,
    me: usize,
    each: impl IntoIterator<Item = String>,
    fix: &str,
) -> PyErr {
    let each: Vec<String> = each
        .into_iter()
        .enumerate()
        .map(|(r, what)| format!("rank {r} {what}"))
        .collect();
    DistError::new_err(format!(
        "{op} on rank {me}: the ranks passed tensors of different sizes: {} ({fix})",
        each.join(", ")
    ))
}

/// `numel` elements of `T` at `ptr` (an empty slice for none, whatever `ptr`).
///
/// # Safety
///
/// `ptr` must point to `numel` initialised, aligned, writable `T`s not aliased for `'a`.
pub(crate) unsafe fn slice<'a, T>(ptr: usize, numel: usize) -> &'a mut [T] {
    if numel == 0 {
        return &mut [];
    }
    // SAFETY: as documented above.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, numel) }
}

/// Copies `nbytes` at host address `ptr` on rank `root` into the same place on every rank
/// (same contract as [`allreduce`]).
#[pyfunction]
pub fn broadcast(py: Python<'_>, ptr: usize, nbytes: usize, root: usize) -> PyResult<()> {
    let d = dist()?;
    let t = d.world.transport();
    if root >= t.size() {
        return Err(PyValueError::new_err(format!(
            "root: {root} is not a rank of {} ranks",
            t.size()
        )));
    }
    if nbytes > 0 && ptr == 0 {
        return Err(PyValueError::new_err("tensor: null data pointer"));
    }
    py.detach(|| {
        // SAFETY: the caller's contract (see `allreduce`).
        let buf: &mut [u8] = if nbytes == 0 {
            &mut []
        } else {
            unsafe { slice(ptr, nbytes) }
        };
        // Every rank's size first: a rank of another size would otherwise fail alone (or
        // truncate under MPI) while the root returns.
        let mut sizes = vec![0u64; t.size()];
        t.allgather_u64(buf.len() as u64, &mut sizes)
            .map_err(comm_error)?;
        if sizes.iter().any(|&n| n != sizes[root]) {
            return Err(size_mismatch(
                "broadcast_",
                t.rank(),
                sizes.iter().map(|n| format!("has {n} bytes")),
                &format!("every rank must pass a tensor of rank {root}'s size and dtype"),
            ));
        }
        let data = if t.rank() == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let got = broadcast_bytes_from(&*t, root, data).map_err(comm_error)?;
        if got.len() != buf.len() {
            return Err(PyValueError::new_err(format!(
                "broadcast: rank {root} sent {} bytes, this rank's tensor has {}",
                got.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&got);
        Ok(())
    })
}

/// Blocks until every rank has called `barrier`.
#[pyfunction]
pub fn barrier(py: Python<'_>) -> PyResult<()> {
    let t = dist()?.world.transport();
    py.detach(|| t.barrier()).map_err(comm_error)
}

/// Aborts every process of the job with exit code `code` (MPI_Abort; under TCP this process
/// exits and its peers fail naming it).
#[pyfunction]
pub fn abort(code: i32) -> PyResult<()> {
    dist()?.world.abort(code)
}
