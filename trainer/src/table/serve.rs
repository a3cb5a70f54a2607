//! The communication thread's part of a step (the caller of [`Table::step`]): the replicas'
//! buckets reduced across the ranks in the order `comm_order` says (see
//! [`ddl_comm::priority`]).
//!
//! `fifo`: each bucket whole, as the replicas hand them over, and the step returns once every
//! bucket is reduced and applied.
//!
//! `priority`: the step sends the replicas their step first, then reduces what is left of the
//! previous step's buckets, lowest stage first (the forward pass the replicas are running
//! waits for them stage by stage; every rank holds the same rest, so no round is needed),
//! then serves this step's buckets as backward hands them over, one agreed chunk at a time,
//! and returns when every rank is done with its backward: the rest goes on during the next
//! step's forward. Before anything reads the weights, [`Table::flush`] reduces the rest and
//! has the replicas apply it.

use std::ops::Range;
use std::time::{Duration, Instant};

use ddl_comm::priority::{Decision, Local};

use crate::config::Precision;
use crate::device::Event;
use crate::error::{Result, TrainError};

use super::comm::Comm;
use super::head::request::Request;
use super::messages::{Cmd, Msg, ReplicaStep, StepCmd};
use super::schedule::Schedule;
use super::shared::Shared;
use super::stats::StepStats;
use super::Table;

/// What the replicas of this rank have reported in the step so far.
#[derive(Default)]
struct Progress {
    stats: StepStats,
    done: usize,
    head: Option<Request>,
}

impl Progress {
    /// Whether this rank has something to negotiate: every replica done, an exchange or a
    /// bucket ready.
    fn offers(&self, schedule: &Schedule, replicas: usize) -> bool {
        self.done == replicas || self.head.is_some() || schedule.negotiator.any_ready()
    }
}

impl Table {
    /// `fifo`: every bucket reduced whole as it comes, until every replica is done.
    pub(super) fn serve_fifo(&mut self, cmd: StepCmd, comm: &dyn Comm) -> Result<StepStats> {
        let mut stats = StepStats::default();
        let mut done = 0;
        let mut reduce = BucketReduce::new(cmd.seq, self.layout.buckets.len(), self.cfg.precision);
        while done < self.replicas() {
            match self.recv()? {
                Msg::Ready(k, copied) => {
                    if let Err(e) = reduce.bucket(&self.shared, k, &copied, comm) {
                        self.shared.abort();
                        return Err(e);
                    }
                }
                Msg::Head(request) => self.serve_head(request, comm)?,
                Msg::StepDone(step) => {
                    done += 1;
                    stats.add(&step);
                }
                _ => return Err(unexpected("during a step")),
            }
        }
        stats.allreduce = reduce.time;
        Ok(stats)
    }

    /// `priority`: agreed chunks (the previous step's rest first) until every rank is done.
    pub(super) fn serve_priority(&mut self, cmd: StepCmd, comm: &dyn Comm) -> Result<StepStats> {
        let Some(mut schedule) = self.schedule.take() else {
            return Err(unexpected("a priority step without a schedule"));
        };
        let served = self.serve_rounds(&mut schedule, cmd, comm);
        schedule.unflushed = true;
        self.schedule = Some(schedule);
        if served.is_err() {
            self.shared.abort();
        }
        served
    }

    fn serve_rounds(
        &mut self,
        schedule: &mut Schedule,
        cmd: StepCmd,
        comm: &dyn Comm,
    ) -> Result<StepStats> {
        let replicas = self.replicas();
        let mut progress = Progress::default();
        // The last step's rest first, without rounds: every rank holds all of it, and nothing
        // of this step can come before the forward has waited for every bucket of it.
        progress.stats.allreduce += self.reduce_rest(schedule, comm)?;
        loop {
            while let Ok(msg) = self.msgs.try_recv() {
                self.progress(schedule, msg, cmd, &mut progress)?;
            }
            // A round only with something to offer (a bucket, an exchange, the whole step):
            // with nothing, this rank is the one behind (every rank hands its buckets over in
            // the same order), and the others wait in the round until it catches up.
            if !progress.offers(schedule, replicas) {
                let msg = self.recv()?;
                self.progress(schedule, msg, cmd, &mut progress)?;
                continue;
            }
            let local = Local {
                done: progress.done == replicas,
                exchange: progress.head.is_some(),
            };
            let t0 = Instant::now();
            let decision = schedule
                .negotiator
                .negotiate(local, self.cfg.ranks, |s| comm.allreduce_sum(s))?;
            progress.stats.allreduce += t0.elapsed();
            let step = (cmd.seq / self.layout.buckets.len() as u64) as i64;
            ddl_trace::record("negotiate", "comm", t0, t0.elapsed(), &[("step", step)]);
            match decision {
                Decision::Exchange => match progress.head.take() {
                    Some(request) => self.serve_head(request, comm)?,
                    None => return Err(unexpected("an exchange agreed on without a request")),
                },
                Decision::Exit => return Ok(progress.stats),
                Decision::Chunk {
                    bucket,
                    range,
                    last,
                } => {
                    let took = self.reduce_chunk(schedule, bucket, range, last, comm)?;
                    progress.stats.allreduce += took;
                }
                // What this rank offers, the others lack: it goes to the next round at once,
                // to be waiting there when the last rank catches up.
                Decision::Wait => {}
            }
        }
    }

    /// Takes note of a replica's message of step `cmd`.
    fn progress(
        &self,
        schedule: &mut Schedule,
        msg: Msg,
        cmd: StepCmd,
        progress: &mut Progress,
    ) -> Result<()> {
        match msg {
            Msg::Ready(k, copied) => {
                schedule.in_flight[k] = Some((cmd.seq, copied, Instant::now()));
                schedule.negotiator.ready(k);
            }
            Msg::Head(request) if progress.head.is_none() => progress.head = Some(request),
            Msg::StepDone(step) => {
                progress.done += 1;
                progress.stats.add(&step);
            }
            Msg::Failed(replica, e) => return Err(self.failed(replica, e)),
            _ => return Err(unexpected("during a step")),
        }
        Ok(())
    }

    /// Allreduces elements `range` of bucket `k` (the first chunk once its copy to the host is
    /// complete); after the `last`, publishes the bucket to the replicas. Returns the time the
    /// allreduce took.
    fn reduce_chunk(
        &self,
        schedule: &mut Schedule,
        k: usize,
        range: Range<usize>,
        last: bool,
        comm: &dyn Comm,
    ) -> Result<Duration> {
        let Some((base, copied, handed)) = &schedule.in_flight[k] else {
            return Err(unexpected("a chunk of a bucket not handed over"));
        };
        let step = (base / self.layout.buckets.len() as u64) as i64;
        if range.start == 0 {
            copied.synchronize()?;
            let args = [("bucket", k as i64), ("step", step)];
            ddl_trace::record("queued", "comm", *handed, handed.elapsed(), &args);
        }
        let took = {
            let mut host = self.shared.host[k]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let buf = &mut host.as_mut_slice()[range.clone()];
            let t0 = Instant::now();
            comm.allreduce_sum(buf)?;
            let took = t0.elapsed();
            let args = [
                ("bucket", k as i64),
                ("step", step),
                ("offset", range.start as i64),
                ("floats", buf.len() as i64),
            ];
            ddl_trace::record("allreduce", "comm", t0, took, &args);
            took
        };
        if last {
            let seq = base + k as u64 + 1;
            schedule.in_flight[k] = None;
            self.shared.publish_reduced(k, seq, false, Event::done());
        }
        Ok(took)
    }

    /// Reduces what is left of the last step's buckets and has every replica apply its
    /// pending updates (`priority` order; nothing to do under `fifo`). Collective: every rank
    /// calls it at the same point, where every rank holds every bucket it has not reduced, so
    /// the rest goes in priority order without negotiating. Call it before anything reads the
    /// weights: evaluation, checkpoints, checksums, exports.
    pub fn flush(&mut self, comm: &dyn Comm) -> Result<()> {
        if !self.schedule.as_ref().is_some_and(Schedule::unflushed) {
            return Ok(());
        }
        let Some(mut schedule) = self.schedule.take() else {
            return Ok(());
        };
        let flushed = self.drain(&mut schedule, comm);
        self.schedule = Some(schedule);
        if flushed.is_err() {
            self.shared.abort();
        }
        flushed
    }

    /// Reduces, in priority order and without rounds, every chunk of the buckets handed over
    /// here and not complete: at a point where every rank holds the same ones (after a step's
    /// exit, before the next step's buckets can come). Returns the time its allreduces took.
    fn reduce_rest(&self, schedule: &mut Schedule, comm: &dyn Comm) -> Result<Duration> {
        let mut took = Duration::ZERO;
        while let Some(decision) = schedule.negotiator.next_rest() {
            if let Decision::Chunk {
                bucket,
                range,
                last,
            } = decision
            {
                took += self.reduce_chunk(schedule, bucket, range, last, comm)?;
            }
        }
        Ok(took)
    }

    fn drain(&mut self, schedule: &mut Schedule, comm: &dyn Comm) -> Result<()> {
        self.reduce_rest(schedule, comm)?;
        for r in 0..self.replicas() {
            self.send(r, Cmd::Flush)?;
        }
        for _ in 0..self.replicas() {
            match self.recv()? {
                Msg::Flushed => {}
                _ => return Err(unexpected("in reply to a flush")),
            }
        }
        schedule.unflushed = false;
        Ok(())
    }
}

/// The error of a message the communication thread did not expect `when`.
fn unexpected(when: &str) -> TrainError {
    TrainError::Replica {
        replica: 0,
        message: format!("unexpected message {when}"),
    }
}

impl StepStats {
    /// Adds one replica's report (the means are taken by the caller).
    pub(super) fn add(&mut self, r: &ReplicaStep) {
        self.loss += r.loss;
        self.images += r.images;
        self.data_wait += r.data_wait;
        self.forward_wait += r.forward_wait;
        self.compute += r.compute;
        self.bad_records += r.bad;
        self.skipped |= r.skipped;
    }
}

/// `fifo`: each bucket's node sum, once its copy to the host is done, allreduced across ranks
/// and published to the replicas.
struct BucketReduce {
    seq: u64,
    buckets: usize,
    next: usize,
    fp16: bool,
    finite: bool,
    /// Time spent in allreduce calls.
    time: Duration,
}

impl BucketReduce {
    fn new(seq: u64, buckets: usize, precision: Precision) -> BucketReduce {
        BucketReduce {
            seq,
            buckets,
            next: 0,
            fp16: precision == Precision::Fp16,
            finite: true,
            time: Duration::ZERO,
        }
    }

    /// Reduces bucket `k` (buckets come in order) and publishes it; with fp16, publishes the
    /// whole step after its last bucket, skipped when any sum is not finite.
    fn bucket(&mut self, shared: &Shared, k: usize, copied: &Event, comm: &dyn Comm) -> Result<()> {
        debug_assert_eq!(k, self.next);
        self.next += 1;
        copied.synchronize()?;
        {
            let mut host = shared.host[k].lock().unwrap_or_else(|e| e.into_inner());
            let buf = host.as_mut_slice();
            let t0 = Instant::now();
            comm.allreduce_sum(buf)?;
            let took = t0.elapsed();
            self.time += took;
            let step = (self.seq / self.buckets as u64) as i64;
            let args = [
                ("bucket", k as i64),
                ("step", step),
                ("floats", buf.len() as i64),
            ];
            ddl_trace::record("allreduce", "comm", t0, took, &args);
            if self.fp16 {
                self.finite &= buf.iter().all(|x| x.is_finite());
            }
        }
        let done = Event::done();
        if !self.fp16 {
            shared.publish_reduced(k, self.seq + k as u64 + 1, false, done);
        } else if self.next == self.buckets {
            shared.publish_step(self.seq, !self.finite, done);
        }
        Ok(())
    }
}
