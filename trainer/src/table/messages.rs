//! What the communication thread and the replica threads tell each other: commands, replies
//! and the state they share for the bucketed tree sum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tch::Tensor;

use crate::device::Event;
use crate::error::{Result, TrainError};

use super::head::exchange::{Exchange, Request};
use super::{BatchIter, EvalSums, ReplicaState, ValidCount};

pub(crate) enum Cmd {
    Data(BatchIter),
    Synthetic,
    Step(StepCmd),
    Eval(BatchIter, ValidCount),
    GetState {
        full: bool,
    },
    SetState(Box<ReplicaState>),
    Checksum,
    /// Apply the updates still pending from the last step (`priority` order).
    Flush,
    Stop,
}

/// One training step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCmd {
    pub(crate) lr: f64,
    /// Bucket sequence number before this step's first bucket.
    pub(crate) seq: u64,
    /// The fp16 loss scale (1 otherwise).
    pub(crate) loss_scale: f64,
    /// What the summed gradient is multiplied by: 1 / (replicas of the job x loss scale).
    pub(crate) inv: f64,
}

/// What a replica reports at the end of its part of a step.
pub(crate) struct ReplicaStep {
    pub(crate) loss: f64,
    pub(crate) images: usize,
    pub(crate) data_wait: Duration,
    /// Time the forward pass waited for the previous step's reduced buckets (`priority`).
    pub(crate) forward_wait: Duration,
    pub(crate) compute: Duration,
    pub(crate) bad: usize,
    /// Whether the update was skipped (fp16 overflow).
    pub(crate) skipped: bool,
}

pub(crate) enum Msg {
    /// Bucket k's node sum is in its host buffer once the event completes.
    Ready(usize, Event),
    /// A head exchange to run across the ranks (`head_parallel`).
    Head(Request),
    /// A replica's backward is done: every bucket of the step is handed over.
    StepDone(ReplicaStep),
    Eval(EvalSums),
    State(Box<ReplicaState>),
    Checksum(u32),
    /// The pending updates are applied.
    Flushed,
    Failed(usize, TrainError),
}

/// Host memory of one bucket, which the allreduce across ranks runs on: pinned for GPU
/// replicas, so that the copies to and from it run on the device's own.
pub(crate) struct HostBucket(Tensor);

impl HostBucket {
    pub(crate) fn new(t: Tensor) -> HostBucket {
        assert!(
            t.is_contiguous() && t.kind() == tch::Kind::Float && t.device() == tch::Device::Cpu
        );
        HostBucket(t)
    }

    pub(crate) fn tensor(&self) -> &Tensor {
        &self.0
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: a contiguous f32 CPU tensor (checked in `new`) owned by `self`, borrowed
        // mutably: the slice covers exactly its elements. Device copies touch it only while
        // the protocol of [`Shared`] keeps the host off it.
        unsafe { std::slice::from_raw_parts_mut(self.0.data_ptr() as *mut f32, self.0.numel()) }
    }
}

/// Where the reduction of one bucket stands.
#[derive(Clone)]
pub(crate) struct Reduced {
    /// The bucket sequence number of its last reduction across ranks (a step's first bucket
    /// is its `seq + 1`, its k-th `seq + k + 1`).
    pub(crate) seq: u64,
    /// Whether the step it belongs to is skipped (fp16 overflow).
    pub(crate) skip: bool,
    /// With one rank: after replica 0 scaled the bucket, which the others copy.
    pub(crate) event: Arc<Event>,
}

/// Synchronisation shared by the replica threads and the communication thread.
pub(crate) struct Shared {
    /// Per replica: the last bucket sequence number whose subtree sum it has published, and
    /// the event after that sum on its device.
    pub(crate) progress: Mutex<Vec<(u64, Arc<Event>)>>,
    pub(crate) progress_cv: Condvar,
    /// With one rank, per replica: the last bucket sequence number it copied from replica 0,
    /// and the event after the copy (replica 0 updates that bucket only after every copy).
    pub(crate) copied: Mutex<Vec<(u64, Arc<Event>)>>,
    pub(crate) copied_cv: Condvar,
    /// Per bucket: its last reduction. Per bucket, because under the `priority` order a
    /// step's buckets are reduced in another order than they were handed over, and the next
    /// step's forward waits for each stage's own.
    pub(crate) reduced: Mutex<Vec<Reduced>>,
    pub(crate) reduced_cv: Condvar,
    /// Host buffer of each bucket (none when the job has one rank).
    pub(crate) host: Vec<Mutex<HostBucket>>,
    /// The exchanges of the head split over the replicas (`head_parallel`).
    pub(crate) head: Option<Exchange>,
    pub(crate) abort: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        replicas: usize,
        buckets: usize,
        host: Vec<Mutex<HostBucket>>,
        head: Option<Exchange>,
    ) -> Shared {
        let done = Arc::new(Event::done());
        Shared {
            progress: Mutex::new(vec![(0, done.clone()); replicas]),
            progress_cv: Condvar::new(),
            copied: Mutex::new(vec![(0, done.clone()); replicas]),
            copied_cv: Condvar::new(),
            reduced: Mutex::new(vec![
                Reduced {
                    seq: 0,
                    skip: false,
                    event: done,
                };
                buckets
            ]),
            reduced_cv: Condvar::new(),
            host,
            head,
            abort: AtomicBool::new(false),
        }
    }

    /// Fails when another replica failed.
    pub(crate) fn aborted(&self, replica: usize) -> Result<()> {
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
        let _c = self.copied.lock().map(|_| self.copied_cv.notify_all());
        let _r = self.reduced.lock().map(|_| self.reduced_cv.notify_all());
        if let Some(head) = &self.head {
            head.wake();
        }
    }

    pub(crate) fn publish(&self, replica: usize, seq: u64, done: Event) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p[replica] = (seq, Arc::new(done));
        self.progress_cv.notify_all();
    }

    /// Waits until `replica` published `seq`; returns the event after its sum (or a later
    /// one of the same stream, which implies it).
    pub(crate) fn wait_progress(&self, me: usize, replica: usize, seq: u64) -> Result<Arc<Event>> {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        while p[replica].0 < seq {
            self.aborted(me)?;
            p = self.progress_cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        Ok(p[replica].1.clone())
    }

    pub(crate) fn publish_copied(&self, replica: usize, seq: u64, done: Event) {
        let mut c = self.copied.lock().unwrap_or_else(|e| e.into_inner());
        c[replica] = (seq, Arc::new(done));
        self.copied_cv.notify_all();
    }

    /// Waits until every replica but 0 copied `seq` from replica 0; returns their events.
    pub(crate) fn wait_copied(&self, seq: u64) -> Result<Vec<Arc<Event>>> {
        let mut c = self.copied.lock().unwrap_or_else(|e| e.into_inner());
        while c[1..].iter().any(|(s, _)| *s < seq) {
            self.aborted(0)?;
            c = self.copied_cv.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        Ok(c[1..].iter().map(|(_, e)| e.clone()).collect())
    }

    /// Bucket `k`'s reduction `seq` is complete (`skip`: its step is skipped).
    pub(crate) fn publish_reduced(&self, k: usize, seq: u64, skip: bool, event: Event) {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        r[k] = Reduced {
            seq,
            skip,
            event: Arc::new(event),
        };
        self.reduced_cv.notify_all();
    }

    /// Every bucket of the step after bucket sequence number `base` is reduced at once (fp16:
    /// whether to skip the step is known only after its last bucket).
    pub(crate) fn publish_step(&self, base: u64, skip: bool, event: Event) {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        let event = Arc::new(event);
        for (k, slot) in r.iter_mut().enumerate() {
            *slot = Reduced {
                seq: base + k as u64 + 1,
                skip,
                event: event.clone(),
            };
        }
        self.reduced_cv.notify_all();
    }

    /// Waits until bucket `k`'s reduction `seq` is complete; returns whether the step is
    /// skipped and the event of the reduction (complete unless one rank's replica 0 reduced on
    /// its device).
    pub(crate) fn wait_reduced(&self, me: usize, k: usize, seq: u64) -> Result<(bool, Arc<Event>)> {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        while r[k].seq < seq {
            self.aborted(me)?;
            r = self.reduced_cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        Ok((r[k].skip, r[k].event.clone()))
    }
}
