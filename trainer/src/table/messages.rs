//! What the communication thread and the replica threads tell each other: commands, replies
//! and the state they share for the bucketed tree sum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

use crate::error::{Result, TrainError};

use super::{BatchIter, EvalSums, ReplicaState, ValidCount};

pub(crate) enum Cmd {
    Data(BatchIter),
    Step { lr: f64, seq: u64, loss_scale: f64 },
    Eval(BatchIter, ValidCount),
    GetState { full: bool },
    SetState(Box<ReplicaState>),
    Checksum,
    Stop,
}

pub(crate) enum Msg {
    Ready(usize),
    StepDone {
        loss: f64,
        images: usize,
        data_wait: Duration,
        compute: Duration,
        bad: usize,
    },
    Eval(EvalSums),
    State(Box<ReplicaState>),
    Checksum(u32),
    Failed(usize, TrainError),
}

/// Synchronisation shared by the replica threads and the communication thread.
pub(crate) struct Shared {
    /// Per replica: bucket sequence numbers whose subtree sum it has published.
    pub(crate) progress: Mutex<Vec<u64>>,
    pub(crate) progress_cv: Condvar,
    /// Bucket sequence numbers reduced across ranks, and whether the current step is skipped.
    pub(crate) reduced: Mutex<(u64, bool)>,
    pub(crate) reduced_cv: Condvar,
    /// Host copy of each bucket.
    pub(crate) host: Vec<RwLock<Vec<f32>>>,
    pub(crate) abort: AtomicBool,
}

impl Shared {
    fn aborted(&self, replica: usize) -> Result<()> {
        if self.abort.load(Ordering::SeqCst) {
            return Err(TrainError::Replica {
                replica,
                message: "aborted because another replica failed".into(),
            });
        }
        Ok(())
    }

    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        let _p = self.progress.lock().map(|_| self.progress_cv.notify_all());
        let _r = self.reduced.lock().map(|_| self.reduced_cv.notify_all());
    }

    pub(crate) fn publish(&self, replica: usize, seq: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p[replica] = seq;
        self.progress_cv.notify_all();
    }

    pub(crate) fn wait_progress(&self, me: usize, replica: usize, seq: u64) -> Result<()> {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        while p[replica] < seq {
            self.aborted(me)?;
            p = self.progress_cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    pub(crate) fn publish_reduced(&self, seq: u64, skip: bool) {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        *r = (seq, skip);
        self.reduced_cv.notify_all();
    }

    pub(crate) fn wait_reduced(&self, me: usize, seq: u64) -> Result<bool> {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        while r.0 < seq {
            self.aborted(me)?;
            r = self.reduced_cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        Ok(r.1)
    }
}
