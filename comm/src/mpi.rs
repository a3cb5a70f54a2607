//! MPI transport (rsmpi over the system's Open MPI / MPICH); [`crate::world::World`] starts MPI
//! and builds the world and node communicators.
//!
//! Point-to-point operations are posted with `MPI_Isend` / `MPI_Irecv` and completed by
//! polling `MPI_Test` until the operation timeout; a peer that never answers makes the call
//! fail with [`CommError::Timeout`] instead of hanging, and a waiting rank looks for another
//! rank's failure notice every 50 ms (`comm/src/failure.rs`), failing with
//! [`CommError::PeerFailed`] when one came. After such an error the job is in an undefined
//! state (cancelled requests may still touch the buffers of the failed call): the caller
//! must end it with [`World::end_failed`](crate::world::World::end_failed) or
//! [`World::abort`](crate::world::World::abort).
//!
//! Polling: while every rank has a core of its own, a waiting rank spins on `MPI_Test`
//! (lowest latency). When a node runs more ranks, or more CPU replicas, than they have cores
//! together (oversubscribed, or an emulated cluster on one machine), spinning ranks steal the
//! cores of the threads that compute, copy and reduce, so a rank that has waited for a while
//! sleeps between polls, for about a sixteenth of the time it has waited so far (at most
//! [`MAX_IDLE_SLEEP`]). [`World`](crate::world::World) picks the mode from the node's rank
//! count and the cores, and again from its compute threads when told of them
//! ([`World::share_cores`](crate::world::World::share_cores)); `DDL_COMM_POLL=spin|backoff`
//! overrides.

use std::ffi::{c_int, c_void};
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::ffi;

use crate::error::{CommError, Result};
use crate::failure::Notices;
use crate::mpi_call::check;
use crate::mpi_call::Serial;
use crate::transport::{check_peer, Op, Transport, MAX_TAG};

/// Keeps MPI initialised while any communicator built on it is alive; finalises on drop when
/// ddl initialised it (MPI started by someone else, e.g. mpi4py, is left to them).
pub(crate) struct Env {
    /// The failure notices of the job's ranks, once the world is made (dropped before MPI is
    /// finalised: fields drop in order).
    pub(crate) notices: OnceLock<Notices>,
    /// MPI stays initialised while this lives (`None`: not ours to finalise).
    pub(crate) _universe: Option<Universe>,
    /// Held around every MPI call unless MPI granted MPI_THREAD_MULTIPLE (ddl asks for
    /// MPI_THREAD_SERIALIZED; a host that initialised MPI may have chosen MULTIPLE).
    pub(crate) serial: Serial,
    /// The thread level MPI granted.
    pub(crate) threading: Threading,
}

impl Env {
    /// Serialises MPI calls unless MPI granted MPI_THREAD_MULTIPLE.
    pub(crate) fn lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.serial.lock()
    }

    /// The failure of a rank this rank knows of, as the error of `op`.
    pub(crate) fn failure(&self, op: &'static str) -> Option<CommError> {
        self.notices.get().and_then(|n| n.error(&self.serial, op))
    }
}

/// How often a waiting rank looks for another rank's failure notice.
const NOTICE_LOOK: Duration = Duration::from_millis(50);

/// What a completed request of an exchange received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receive {
    /// Nothing (a send, a barrier).
    Nothing,
    /// A message of exactly this many bytes.
    Exactly(usize),
    /// A message of at most the buffer's length.
    UpTo,
}

/// Longest sleep between two polls of a waiting rank in [`Polling::Backoff`] mode.
pub const MAX_IDLE_SLEEP: Duration = Duration::from_micros(500);

/// Polls before a waiting rank in [`Polling::Backoff`] mode starts to sleep.
const SPIN_POLLS: u32 = 64;

/// How a rank waits for its outstanding requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polling {
    /// `MPI_Test` in a loop, yielding the core between rounds.
    Spin,
    /// Spin for a few rounds, then sleep between polls for a sixteenth of the time waited so
    /// far (at most [`MAX_IDLE_SLEEP`]), leaving the cores to ranks with work to do.
    Backoff,
}

impl Polling {
    /// The mode for a node whose ranks keep `busy_threads` threads busy together (the ranks,
    /// or their CPU replicas) on `cores` cores ([`crate::cores::node_cores`]): `DDL_COMM_POLL`
    /// (`spin` or `backoff`) if set, otherwise backoff exactly when the threads outnumber the
    /// cores.
    pub fn for_node(busy_threads: usize, cores: usize) -> Polling {
        match std::env::var("DDL_COMM_POLL").as_deref() {
            Ok("spin") => Polling::Spin,
            Ok("backoff") => Polling::Backoff,
            _ if busy_threads > cores => Polling::Backoff,
            _ => Polling::Spin,
        }
    }
}

/// The value of `MPI_IN_PLACE` in the MPI library this process runs with, which rsmpi does
/// not export: `(void *) 1` in Open MPI, `(void *) -1` in MPICH and its derivatives (Intel
/// MPI, MVAPICH, Cray MPICH), told apart by `MPI_Get_library_version`; `None` for another
/// library.
fn mpi_in_place() -> Option<*mut c_void> {
    static IN_PLACE: std::sync::OnceLock<Option<isize>> = std::sync::OnceLock::new();
    let value = IN_PLACE.get_or_init(|| {
        let mut buf = vec![0 as c_char; 8192];
        let mut len: c_int = 0;
        // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING (<= 8192) chars; callable
        // before and after MPI_Init.
        unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
        let bytes: Vec<u8> = buf[..len.max(0) as usize]
            .iter()
            .map(|&c| c as u8)
            .collect();
        let version = String::from_utf8_lossy(&bytes);
        if version.contains("Open MPI") {
            Some(1)
        } else if ["MPICH", "Intel(R) MPI", "MVAPICH"]
            .iter()
            .any(|name| version.contains(name))
        {
            Some(-1)
        } else {
            None
        }
    });
    value.map(|v| v as *mut c_void)
}

fn to_c_int(op: &'static str, what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| {
        CommError::InvalidArgument(format!("{op}: {what} {v} exceeds MPI's int range"))
    })
}

/// The requests of an exchange and the lengths they received.
#[derive(Default)]
struct Requests {
    reqs: Vec<ffi::MPI_Request>,
    counts: Vec<usize>,
}

/// An MPI communicator as a [`Transport`].
pub struct MpiTransport {
    comm: ffi::MPI_Comm,
    /// Whether this handle was created by us (freed on drop) or is MPI_COMM_WORLD.
    owned: bool,
    /// This rank in the communicator.
    pub(crate) rank: usize,
    /// Ranks in the communicator.
    pub(crate) size: usize,
    timeout_ns: AtomicU64,
    /// [`Polling::Backoff`] when true.
    backoff: AtomicBool,
    /// The request and length vectors of the last exchange, for the next one to reuse. An
    /// exchange takes them out for its length, so threads never wait for each other's
    /// exchanges: a lock held through one made the record exchange's thread wait for the
    /// main thread's allreduce while the peer that allreduce waited for waited for this
    /// rank's records, and both ranks timed out.
    spare: Mutex<Option<Requests>>,
    /// MPI itself, kept initialised while this communicator lives.
    pub(crate) env: Arc<Env>,
}

// SAFETY: MPI handles are plain identifiers; concurrent use is allowed by
// MPI_THREAD_MULTIPLE, and otherwise every call is serialised by `Env::serial`.
unsafe impl Send for MpiTransport {}
// SAFETY: as above.
unsafe impl Sync for MpiTransport {}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiTransport")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout())
            .finish()
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        if self.owned {
            let _g = self.env.lock();
            // SAFETY: the communicator was created by MPI_Comm_split*, MPI is still
            // initialised because `env` is alive.
            unsafe { ffi::MPI_Comm_free(&mut self.comm) };
        }
    }
}

impl MpiTransport {
    /// Wraps communicator `comm` (freed on drop if `owned`), returning errors instead of
    /// aborting.
    pub(crate) fn wrap(
        env: Arc<Env>,
        comm: ffi::MPI_Comm,
        owned: bool,
        timeout: Duration,
    ) -> Result<Self> {
        let mut rank: c_int = 0;
        let mut size: c_int = 0;
        // SAFETY: valid communicator; errors are returned, not fatal.
        unsafe {
            check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
            )?;
            check("MPI_Comm_rank", ffi::MPI_Comm_rank(comm, &mut rank))?;
            check("MPI_Comm_size", ffi::MPI_Comm_size(comm, &mut size))?;
        }
        Ok(MpiTransport {
            comm,
            owned,
            rank: rank as usize,
            size: size as usize,
            timeout_ns: AtomicU64::new(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
            backoff: AtomicBool::new(false),
            spare: Mutex::new(None),
            env,
        })
    }

    /// MPI_Comm_split of this communicator, keeping its timeout and polling.
    pub(crate) fn split_raw(&self, color: c_int, key: c_int) -> Result<MpiTransport> {
        // SAFETY: extern static of the MPI binding.
        let mut newcomm = unsafe { ffi::RSMPI_COMM_NULL };
        {
            let _g = self.env.lock();
            // SAFETY: collective over a valid communicator.
            check("MPI_Comm_split", unsafe {
                ffi::MPI_Comm_split(self.comm, color, key, &mut newcomm)
            })?;
        }
        let t = MpiTransport::wrap(self.env.clone(), newcomm, true, self.timeout())?;
        t.set_polling(self.polling());
        Ok(t)
    }

    /// How this endpoint waits for its requests (inherited by groups split from it).
    pub fn polling(&self) -> Polling {
        if self.backoff.load(Ordering::Relaxed) {
            Polling::Backoff
        } else {
            Polling::Spin
        }
    }

    /// Changes how this endpoint waits for its requests.
    pub fn set_polling(&self, polling: Polling) {
        self.backoff
            .store(polling == Polling::Backoff, Ordering::Relaxed);
    }

    /// Polls `reqs` (MPI_Test) until all complete or the deadline passes. `peers(i)` names
    /// the peer of request i and what it receives; the length of each message received lands
    /// in `counts[i]` where `counts` has a slot for it (checked for [`Receive::Exactly`]).
    fn complete(
        &self,
        op: &'static str,
        reqs: &mut [ffi::MPI_Request],
        peers: &dyn Fn(usize) -> (Option<usize>, Receive),
        counts: &mut [usize],
    ) -> Result<()> {
        let timeout = self.timeout();
        let backoff = self.polling() == Polling::Backoff;
        let start = Instant::now();
        let mut remaining = reqs.len();
        let mut polls: u32 = 0;
        let mut look = NOTICE_LOOK;
        // SAFETY (whole function): requests were posted on buffers that outlive this call.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut first_err: Option<CommError> = None;
        while remaining > 0 {
            {
                let _g = self.env.lock();
                for (i, r) in reqs.iter_mut().enumerate() {
                    if *r == null {
                        continue;
                    }
                    let mut flag: c_int = 0;
                    let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
                    let code = unsafe { ffi::MPI_Test(r, &mut flag, status.as_mut_ptr()) };
                    if code != 0 {
                        first_err.get_or_insert_with(|| check(op, code).unwrap_err());
                        *r = null;
                        remaining -= 1;
                        continue;
                    }
                    if flag != 0 {
                        remaining -= 1;
                        *r = null;
                        let (peer, receive) = peers(i);
                        if let (Some(peer), true) = (peer, receive != Receive::Nothing) {
                            let status = unsafe { status.assume_init() };
                            let mut count: c_int = 0;
                            unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                            let got = count.max(0) as usize;
                            if let Some(c) = counts.get_mut(i) {
                                *c = got;
                            }
                            if let Receive::Exactly(expected) = receive {
                                if got != expected && first_err.is_none() {
                                    first_err = Some(CommError::SizeMismatch {
                                        op,
                                        rank: self.rank,
                                        peer,
                                        expected,
                                        got,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            if remaining == 0 {
                break;
            }
            // Let other ranks sharing this core progress (as Open MPI does when
            // oversubscribed); check the deadline every few rounds.
            polls = polls.saturating_add(1);
            if backoff && polls > SPIN_POLLS {
                std::thread::sleep((start.elapsed() / 16).min(MAX_IDLE_SLEEP));
            } else {
                std::thread::yield_now();
            }
            if polls % 16 != 0 {
                continue;
            }
            let waited = start.elapsed();
            if waited > timeout {
                let stuck = reqs.iter().position(|r| *r != null).unwrap_or(0);
                self.cancel_all(reqs);
                return Err(CommError::Timeout {
                    op,
                    rank: self.rank,
                    peer: peers(stuck).0,
                    timeout,
                });
            }
            if waited >= look {
                look = waited + NOTICE_LOOK;
                if let Some(e) = self.env.failure(op) {
                    self.cancel_all(reqs);
                    return Err(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Transport::exchange`] with `requests` for its requests and lengths.
    fn exchange_with(&self, ops: &mut [Op<'_>], requests: &mut Requests) -> Result<()> {
        let Requests { reqs, counts } = requests;
        reqs.clear();
        // SAFETY: extern static of the MPI binding.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        reqs.resize(ops.len(), null);
        for op in ops.iter() {
            check_peer("exchange", self.rank, op.peer(), self.size)?;
            let tag = match op {
                Op::Send { tag, .. } | Op::Recv { tag, .. } | Op::RecvUpTo { tag, .. } => *tag,
            };
            if tag > MAX_TAG {
                return Err(CommError::InvalidArgument(format!(
                    "exchange: tag {tag} exceeds {MAX_TAG}"
                )));
            }
        }
        let mut post_err = None;
        {
            let _g = self.env.lock();
            for (op, r) in ops.iter_mut().zip(reqs.iter_mut()) {
                let code = match op {
                    Op::Send { to, tag, data } => {
                        let n = to_c_int("exchange", "message bytes", data.len())?;
                        // SAFETY: `data` outlives the request (completed or freed below).
                        unsafe {
                            ffi::MPI_Isend(
                                data.as_ptr().cast::<c_void>(),
                                n,
                                ffi::RSMPI_UINT8_T,
                                *to as c_int,
                                *tag as c_int,
                                self.comm,
                                r,
                            )
                        }
                    }
                    Op::Recv { from, tag, buf } | Op::RecvUpTo { from, tag, buf, .. } => {
                        let n = to_c_int("exchange", "message bytes", buf.len())?;
                        // SAFETY: `buf` outlives the request (completed or cancelled below).
                        unsafe {
                            ffi::MPI_Irecv(
                                buf.as_mut_ptr().cast::<c_void>(),
                                n,
                                ffi::RSMPI_UINT8_T,
                                *from as c_int,
                                *tag as c_int,
                                self.comm,
                                r,
                            )
                        }
                    }
                };
                if code != 0 {
                    post_err = Some(check("MPI_Isend/MPI_Irecv", code).unwrap_err());
                    break;
                }
            }
        }
        if let Some(e) = post_err {
            self.cancel_all(reqs);
            return Err(e);
        }
        let peers = |i: usize| match &ops[i] {
            Op::Send { to, .. } => (Some(*to), Receive::Nothing),
            Op::Recv { from, buf, .. } => (Some(*from), Receive::Exactly(buf.len())),
            Op::RecvUpTo { from, .. } => (Some(*from), Receive::UpTo),
        };
        let op_name = match ops {
            [Op::Send { .. }] => "send",
            [Op::Recv { .. }] => "recv",
            _ => "exchange",
        };
        // Lengths are kept only for a batch that asks for them (the call check's first one).
        let up_to = ops.iter().any(|op| matches!(op, Op::RecvUpTo { .. }));
        counts.clear();
        if up_to {
            counts.resize(ops.len(), 0);
        }
        let done = self.complete(op_name, reqs, &peers, counts);
        for (op, &count) in ops.iter_mut().zip(counts.iter()) {
            if let Op::RecvUpTo { got, .. } = op {
                **got = count;
            }
        }
        done
    }

    /// Cancels and releases outstanding requests after a timeout (best effort).
    fn cancel_all(&self, reqs: &mut [ffi::MPI_Request]) {
        let _g = self.env.lock();
        // SAFETY: requests are valid or null.
        unsafe {
            let null = ffi::RSMPI_REQUEST_NULL;
            for r in reqs.iter_mut() {
                if *r != null {
                    ffi::MPI_Cancel(r);
                    ffi::MPI_Request_free(r);
                }
            }
        }
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.exchange(&mut [Op::Send { to, tag, data }])
    }

    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        self.exchange(&mut [Op::Recv { from, tag, buf }])
    }

    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        let spare = || self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let mut requests = spare().take().unwrap_or_default();
        let done = self.exchange_with(ops, &mut requests);
        *spare() = Some(requests);
        done
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        let color = to_c_int("split", "color", color)?;
        let key = to_c_int("split", "key", key)?;
        Ok(Box::new(self.split_raw(color, key)?))
    }

    fn barrier(&self) -> Result<()> {
        let mut req = [unsafe { ffi::RSMPI_REQUEST_NULL }];
        {
            let _g = self.env.lock();
            // SAFETY: valid communicator; request completed below.
            check("MPI_Ibarrier", unsafe {
                ffi::MPI_Ibarrier(self.comm, &mut req[0])
            })?;
        }
        self.complete("barrier", &mut req, &|_| (None, Receive::Nothing), &mut [0])
    }

    fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout_ns.store(
            u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn has_native_allreduce(&self) -> bool {
        true
    }

    fn announce_failure(&self, reason: &str) {
        if let Some(n) = self.env.notices.get() {
            n.announce(&self.env.serial, reason);
        }
    }

    fn failure(&self, op: &'static str) -> Option<CommError> {
        self.env.failure(op)
    }

    /// MPI_Allreduce in place on `buf` (blocking: the operation timeout does not apply to
    /// it).
    fn native_allreduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let n = to_c_int("MPI_Allreduce", "element count", buf.len())?;
        let in_place = mpi_in_place().ok_or_else(|| {
            CommError::Unsupported(
                "the mpi algorithm knows MPI_IN_PLACE of Open MPI and MPICH-derived libraries only"
                    .into(),
            )
        })?;
        let _g = self.env.lock();
        // SAFETY: `buf` holds n floats; MPI_IN_PLACE makes it both input and output.
        check("MPI_Allreduce", unsafe {
            ffi::MPI_Allreduce(
                in_place,
                buf.as_mut_ptr().cast::<c_void>(),
                n,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                self.comm,
            )
        })
    }

    /// MPI_Allgather of one word per rank (blocking, like MPI_Allreduce).
    fn native_allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        if all.len() != self.size {
            return Err(CommError::InvalidArgument(format!(
                "MPI_Allgather: {} slots for {} ranks",
                all.len(),
                self.size
            )));
        }
        let _g = self.env.lock();
        // SAFETY: one u64 sent, one received per rank into `all`, which holds size of them.
        check("MPI_Allgather", unsafe {
            ffi::MPI_Allgather(
                (&word as *const u64).cast::<c_void>(),
                1,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr().cast::<c_void>(),
                1,
                ffi::RSMPI_UINT64_T,
                self.comm,
            )
        })
    }
}
