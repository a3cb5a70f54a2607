//! A rank that fails tells the others why ([`Transport::announce_failure`]), so that the job
//! ends within seconds with every rank naming the failed rank and its reason, instead of the
//! others waiting out the operation timeout for a rank that stopped.
//!
//! Over MPI the notices travel on a duplicate of the world communicator, never meeting the
//! job's own messages. Every rank keeps one receive posted for a notice from any rank and
//! tests it while it waits (an exchange's polls, a shared-memory wait's looks at its peers).
//! A rank that fails sends its reason to every other rank; a rank that learns of a failure
//! stops, says which rank failed and why, and tells the failed rank that it did; the failed
//! rank ends the job once every rank has told it (at most [`GRACE`] later), so that no rank
//! is killed before it has said why it stops ([`crate::World::end_failed`]).
//!
//! [`Transport::announce_failure`]: crate::Transport::announce_failure

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mpi::ffi;

use crate::error::{CommError, Result};
use crate::mpi_call::{check, Serial};

/// Longest a failed rank waits for the others to say that they stop before it ends the job
/// (a rank blocked inside MPI's own collective, the `mpi` algorithm, never says it).
pub const GRACE: Duration = Duration::from_secs(10);

/// Most bytes of a reason sent (a longer one is cut).
const REASON_BYTES: usize = 2048;

/// Tag of a notice: the failed rank's reason.
const FAILED: c_int = 1;
/// Tag of the answer to a notice: the sender stops because of that failure.
const STOPS: c_int = 2;

/// Pause between two looks while a rank settles its notices.
const SETTLE_POLL: Duration = Duration::from_millis(1);

/// A failure of the job: the rank that failed (in the world) and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The failed rank.
    pub rank: usize,
    /// What it said.
    pub reason: String,
}

/// This rank's end of the notices (see the module documentation).
pub(crate) struct Notices {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    state: Mutex<State>,
    /// The first failure this rank learnt of: another rank's, or its own once announced.
    seen: OnceLock<Failure>,
}

/// The requests of the notices and what they told.
struct State {
    /// The posted receive of a notice or an answer from any rank.
    recv: ffi::MPI_Request,
    /// Its buffer.
    buf: Box<[u8]>,
    /// Ranks that told this one they stop (failed themselves, or answered its notice).
    told: Vec<bool>,
    /// This rank's notices and answers in flight.
    sends: Vec<ffi::MPI_Request>,
    /// The bytes of this rank's notice while it travels.
    reason: Box<[u8]>,
}

// SAFETY: MPI handles are plain identifiers; every call on them is made under `state`'s lock
// and the MPI lock ([`Serial`], unless MPI_THREAD_MULTIPLE).
unsafe impl Send for Notices {}
// SAFETY: as above.
unsafe impl Sync for Notices {}

impl Notices {
    /// Starts listening for notices on a duplicate of `world` (collective over it), as rank
    /// `rank` of `size`.
    pub(crate) fn start(
        serial: &Serial,
        world: ffi::MPI_Comm,
        rank: usize,
        size: usize,
    ) -> Result<Self> {
        // SAFETY: extern statics of the MPI binding.
        let (mut comm, recv) = unsafe { (ffi::RSMPI_COMM_NULL, ffi::RSMPI_REQUEST_NULL) };
        {
            let _g = serial.lock();
            // SAFETY: collective over a valid communicator; freed on drop.
            check("MPI_Comm_dup", unsafe {
                ffi::MPI_Comm_dup(world, &mut comm)
            })?;
        }
        let notices = Notices {
            comm,
            rank,
            size,
            state: Mutex::new(State {
                recv,
                buf: vec![0; REASON_BYTES].into_boxed_slice(),
                told: vec![false; size],
                sends: Vec::new(),
                reason: Box::default(),
            }),
            seen: OnceLock::new(),
        };
        let mut state = notices.lock();
        let _g = serial.lock();
        notices.post(&mut state)?;
        drop(state);
        Ok(notices)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts the receive of the next notice or answer (under the MPI lock).
    fn post(&self, state: &mut State) -> Result<()> {
        // SAFETY: the buffer lives in `state`, which outlives the request (cancelled on drop).
        check("MPI_Irecv", unsafe {
            ffi::MPI_Irecv(
                state.buf.as_mut_ptr().cast::<c_void>(),
                REASON_BYTES as c_int,
                ffi::RSMPI_UINT8_T,
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                self.comm,
                &mut state.recv,
            )
        })
    }

    /// The failure this rank knows of, after taking in the notices that arrived.
    pub(crate) fn poll(&self, serial: &Serial) -> Option<Failure> {
        let mut state = self.lock();
        let _g = serial.lock();
        loop {
            let mut done: c_int = 0;
            let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
            // SAFETY: a valid request; `status` is written when it completes.
            let code = unsafe { ffi::MPI_Test(&mut state.recv, &mut done, status.as_mut_ptr()) };
            if code != 0 || done == 0 {
                break;
            }
            // SAFETY: the request completed, so MPI wrote the status.
            let status = unsafe { status.assume_init() };
            let mut count: c_int = 0;
            // SAFETY: the status of a completed receive.
            unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
            let from = status.MPI_SOURCE as usize;
            if let Some(told) = state.told.get_mut(from) {
                *told = true;
            }
            if status.MPI_TAG == FAILED {
                let bytes = &state.buf[..(count.max(0) as usize).min(REASON_BYTES)];
                let reason = String::from_utf8_lossy(bytes).into_owned();
                self.seen.get_or_init(|| Failure { rank: from, reason });
            }
            if self.post(&mut state).is_err() {
                break;
            }
        }
        state.sends.retain_mut(|r| {
            let mut done: c_int = 0;
            // SAFETY: a valid send request; its buffer lives in `state` or is empty.
            let code = unsafe { ffi::MPI_Test(r, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            code == 0 && done == 0
        });
        self.seen.get().cloned()
    }

    /// Tells every other rank that this rank failed with `reason`, unless it knows of a
    /// failure already (its own, or another rank's, which then caused this one). Its own
    /// waits fail from now on.
    pub(crate) fn announce(&self, serial: &Serial, reason: &str) {
        if self.poll(serial).is_some() {
            return;
        }
        let mut cut = reason.len().min(REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let mine = Failure {
            rank: self.rank,
            reason: reason[..cut].to_string(),
        };
        if self.seen.get_or_init(|| mine.clone()) != &mine {
            return;
        }
        let mut state = self.lock();
        state.reason = mine.reason.into_bytes().into_boxed_slice();
        let _g = serial.lock();
        for q in (0..self.size).filter(|&q| q != self.rank) {
            let bytes = (state.reason.as_ptr(), state.reason.len() as c_int);
            self.send(&mut state, bytes, q, FAILED);
        }
    }

    /// Tells rank `failed` that this rank stops because of its failure.
    pub(crate) fn answer(&self, serial: &Serial, failed: usize) {
        let mut state = self.lock();
        let _g = serial.lock();
        self.send(&mut state, (std::ptr::null(), 0), failed, STOPS);
    }

    /// Posts a send of `bytes` to `to` with `tag` (under the MPI lock); a send that cannot
    /// be posted is left out: the notices are the best the rank can do as it goes.
    fn send(&self, state: &mut State, (ptr, len): (*const u8, c_int), to: usize, tag: c_int) {
        // SAFETY: extern static of the MPI binding.
        let mut r = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `ptr` is null with `len` 0 or `state.reason`, which stays until the send
        // completes (or is leaked on drop).
        let code = unsafe {
            ffi::MPI_Isend(
                ptr.cast::<c_void>(),
                len,
                ffi::RSMPI_UINT8_T,
                to as c_int,
                tag,
                self.comm,
                &mut r,
            )
        };
        if code == 0 {
            state.sends.push(r);
        }
    }

    /// Waits until this rank, the failed one, has sent its notices and every other rank has
    /// said that it stops, or `grace` has passed. Another rank waits the whole `grace`: the
    /// failed rank ends the job within it.
    pub(crate) fn settle(&self, serial: &Serial, grace: Duration) {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let failed_here = self.poll(serial).is_some_and(|f| f.rank == self.rank);
            let state = self.lock();
            let all_told = (0..self.size).all(|q| q == self.rank || state.told[q]);
            if failed_here && all_told && state.sends.is_empty() {
                return;
            }
            drop(state);
            std::thread::sleep(SETTLE_POLL);
        }
    }

    /// The failure this rank knows of as the error of `op` on this rank.
    pub(crate) fn error(&self, serial: &Serial, op: &'static str) -> Option<CommError> {
        self.poll(serial).map(|f| CommError::PeerFailed {
            op,
            rank: self.rank,
            peer: f.rank,
            reason: f.reason,
        })
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: valid requests and communicator; the receive is cancelled and completed
        // before its buffer goes; sends still in flight keep their bytes (leaked).
        unsafe {
            ffi::MPI_Cancel(&mut state.recv);
            ffi::MPI_Wait(&mut state.recv, ffi::RSMPI_STATUS_IGNORE);
            for r in &mut state.sends {
                ffi::MPI_Request_free(r);
            }
            if !state.sends.is_empty() {
                std::mem::forget(std::mem::take(&mut state.reason));
            }
            ffi::MPI_Comm_free(&mut self.comm);
        }
    }
}
