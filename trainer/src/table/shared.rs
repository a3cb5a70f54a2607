//! Synchronisation shared by the replica threads and the communication thread ([`Shared`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::device::Event;
use crate::error::{Result, TrainError};

use super::head::exchange::Exchange;
use super::messages::{HostBucket, Reduced};

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
