//! The exchanges of a head split over the replicas: between the replicas of a rank on their
//! devices, and through the communication thread across the ranks.
//!
//! Every replica offers a tensor for exchange `seq` (with the event after it); replica 0 waits
//! for all offers and combines them on its device in replica order (concatenated, maxed or
//! summed). With one rank that is the result. With several, replica 0 copies it to the host
//! buffer on its side stream and asks the communication thread ([`Exchange::serve`]) to run
//! the collective across the ranks on it: an allgather of every rank's rows (with their
//! counts exchanged first when they vary, in evaluation), an allreduce with `max` or with
//! sum, or a reduce-scatter of the rows. Every replica then waits for the published result
//! and takes what it needs from it on its own device. The results are combined in a fixed
//! order, so every replica of every rank sees bitwise the same values.
//!
//! A replica offers exchange `seq + 1` only after it queued its copy out of `seq`, and replica
//! 0 combines (and copies to the host) only after waiting on every offer's event, so the host
//! buffer and the combined tensor, which replica 0 keeps until its next exchange, are never
//! overwritten while a copy out of them may still run.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crossbeam_channel::Sender;
use ddl_comm::Parts;
use tch::{Kind, Tensor};

use crate::device::{DeviceCtx, Event};
use crate::error::{Result, TrainError};

use super::super::comm::Comm;
use super::super::messages::{HostBucket, Msg};
use super::request::{Op, Request};

/// The result of an exchange, the same on every replica of every rank.
pub(crate) struct Exchanged {
    seq: u64,
    /// Every element of the result, flat: in the host buffer (several ranks) or on replica 0's
    /// device.
    pub(crate) tensor: Tensor,
    event: Arc<Event>,
    /// A gather's rows of every rank, in rank order.
    pub(crate) rows: Vec<usize>,
    /// Evaluation: whether any rank still had a batch.
    pub(crate) more: bool,
    /// The element where this rank's part starts (a gather's own rows, a reduce-scatter's sums).
    pub(crate) own: usize,
}

impl Exchanged {
    fn copy(&self) -> Exchanged {
        Exchanged {
            seq: self.seq,
            tensor: self.tensor.shallow_clone(),
            event: self.event.clone(),
            rows: self.rows.clone(),
            more: self.more,
            own: self.own,
        }
    }
}

/// One replica's part of an exchange.
struct Offer {
    seq: u64,
    tensor: Tensor,
    event: Arc<Event>,
    more: bool,
}

/// The replica offering: its index, device and channel to the communication thread.
pub(crate) struct Side<'a> {
    pub(crate) index: usize,
    pub(crate) ctx: &'a DeviceCtx,
    pub(crate) tx: &'a Sender<Msg>,
}

/// The exchanges of one rank's replicas (see the module doc).
pub(crate) struct Exchange {
    ranks: usize,
    rank: usize,
    offers: Mutex<Vec<Option<Offer>>>,
    offered: Condvar,
    result: Mutex<Option<Exchanged>>,
    published: Condvar,
    /// Several ranks: where the rank-wide values meet the collectives across ranks.
    host: Option<Mutex<HostBucket>>,
    /// Replica 0's last combined tensor, kept while copies out of it may run.
    kept: Mutex<Option<Tensor>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Exchange {
    /// The exchanges of `replicas` replicas of rank `rank` of `ranks`; with several ranks,
    /// `host` holds the largest exchange across them.
    pub(crate) fn new(ranks: usize, rank: usize, replicas: usize, host: Option<Tensor>) -> Self {
        Exchange {
            ranks,
            rank,
            offers: Mutex::new((0..replicas).map(|_| None).collect()),
            offered: Condvar::new(),
            result: Mutex::new(None),
            published: Condvar::new(),
            host: host.map(|t| Mutex::new(HostBucket::new(t))),
            kept: Mutex::new(None),
        }
    }

    /// Wakes every replica waiting here (a replica failed).
    pub(crate) fn wake(&self) {
        let _o = self.offers.lock().map(|_| self.offered.notify_all());
        let _r = self.result.lock().map(|_| self.published.notify_all());
    }

    /// Replica `me` takes part in exchange `seq` of `op` with `t` (rows of `width` elements;
    /// `more`: evaluation, whether this replica had a batch); returns the result once it is
    /// ready to be read on `me`'s device. `aborted` fails the wait when another replica failed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange(
        &self,
        me: &Side<'_>,
        seq: u64,
        op: Op,
        t: &Tensor,
        width: usize,
        more: bool,
        aborted: &dyn Fn() -> Result<()>,
    ) -> Result<Exchanged> {
        {
            let mut offers = lock(&self.offers);
            offers[me.index] = Some(Offer {
                seq,
                tensor: t.shallow_clone(),
                event: Arc::new(me.ctx.record()?),
                more,
            });
            self.offered.notify_all();
        }
        if me.index == 0 {
            self.combine(me, seq, op, width, aborted)?;
        }
        let got = {
            let mut r = lock(&self.result);
            while r.as_ref().is_none_or(|x| x.seq < seq) {
                aborted()?;
                r = self.published.wait(r).unwrap_or_else(|e| e.into_inner());
            }
            r.as_ref().map(Exchanged::copy)
        };
        let got = got.ok_or_else(|| TrainError::Replica {
            replica: me.index,
            message: "head exchange without a result".into(),
        })?;
        me.ctx.wait(&got.event)?;
        Ok(got)
    }

    /// Replica 0: every offer of `seq` combined on its device, published (one rank) or handed
    /// to the communication thread (several).
    fn combine(
        &self,
        me: &Side<'_>,
        seq: u64,
        op: Op,
        width: usize,
        aborted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let (combined, more) = self.combined(me, seq, op, aborted)?;
        let rows = match (width, op) {
            (0, _) => 0,
            // Every rank sums all rows and keeps its share.
            (w, Op::Scatter) => combined.numel() / w / self.ranks,
            (w, _) => combined.numel() / w,
        };
        let Some(host) = &self.host else {
            let result = Exchanged {
                seq,
                tensor: combined.shallow_clone(),
                event: Arc::new(me.ctx.record()?),
                rows: vec![rows],
                more,
                own: 0,
            };
            *lock(&self.kept) = Some(combined);
            self.publish(result);
            return Ok(());
        };
        let len = combined.numel();
        me.ctx.wait_side(&me.ctx.record()?)?;
        let copied = {
            let host = lock(host);
            let mut dst = host.tensor().f_narrow(0, 0, len as i64)?;
            me.ctx.copy_side(&mut dst, &combined)?
        };
        *lock(&self.kept) = Some(combined);
        let request = Request {
            seq,
            op,
            rows,
            width,
            len,
            more,
            copied,
        };
        me.tx
            .send(Msg::Head(request))
            .map_err(|_| TrainError::Replica {
                replica: 0,
                message: "communication thread is gone".into(),
            })
    }

    /// Replica 0, once every replica offered `seq`: the offers combined by `op` in replica
    /// order on its device (flat), and whether any replica still had a batch.
    fn combined(
        &self,
        me: &Side<'_>,
        seq: u64,
        op: Op,
        aborted: &dyn Fn() -> Result<()>,
    ) -> Result<(Tensor, bool)> {
        let (parts, more) = {
            let mut offers = lock(&self.offers);
            while offers
                .iter()
                .any(|o| o.as_ref().is_none_or(|o| o.seq < seq))
            {
                aborted()?;
                offers = self.offered.wait(offers).unwrap_or_else(|e| e.into_inner());
            }
            let more = offers.iter().flatten().any(|o| o.more);
            let parts: Vec<(Tensor, Arc<Event>)> = offers
                .iter()
                .flatten()
                .map(|o| (o.tensor.shallow_clone(), o.event.clone()))
                .collect();
            (parts, more)
        };
        let device = me.ctx.device();
        let mut on_device = Vec::with_capacity(parts.len());
        for (i, (t, event)) in parts.into_iter().enumerate() {
            if i > 0 {
                me.ctx.wait(&event)?;
            }
            on_device.push(t.f_to_device(device)?);
        }
        let combined = match op {
            Op::Gather | Op::GatherCounted => Tensor::f_cat(&on_device, 0)?,
            Op::Max => fold(on_device, |a, b| a.f_maximum(b))?,
            Op::Sum | Op::Scatter => fold(on_device, |a, b| a.f_add(b))?,
        };
        Ok((combined.f_reshape([-1])?, more))
    }

    fn publish(&self, result: Exchanged) {
        *lock(&self.result) = Some(result);
        self.published.notify_all();
    }

    /// The communication thread: runs `req` across the ranks on the host buffer and publishes
    /// the result.
    pub(crate) fn serve(&self, req: Request, comm: &dyn Comm) -> Result<()> {
        req.copied.synchronize()?;
        let host = self.host.as_ref().ok_or_else(|| TrainError::Replica {
            replica: 0,
            message: "a head exchange across ranks in a job of one rank".into(),
        })?;
        let mut host = lock(host);
        let (p, q) = (self.ranks, self.rank);
        let mut result = Exchanged {
            seq: req.seq,
            tensor: Tensor::new(),
            event: Arc::new(Event::done()),
            rows: Vec::new(),
            more: req.more,
            own: 0,
        };
        let buf = host.as_mut_slice();
        let len = match req.op {
            Op::Gather | Op::GatherCounted | Op::Scatter => {
                result.rows = if req.op == Op::GatherCounted {
                    let (rows, more) = counts(comm, p, q, req.rows, req.more)?;
                    result.more = more;
                    rows
                } else {
                    vec![req.rows; p]
                };
                let parts = Parts::from_counts(&result.rows).scaled(req.width);
                result.own = parts.range(q).start;
                if req.op == Op::Scatter {
                    comm.reduce_scatter(&mut buf[..parts.len()], &parts)?;
                } else {
                    buf.copy_within(0..req.len, result.own);
                    comm.all_gather(&mut buf[..parts.len()], &parts)?;
                }
                parts.len()
            }
            Op::Max => {
                comm.allreduce_max(&mut buf[..req.len])?;
                req.len
            }
            Op::Sum => {
                comm.allreduce_sum(&mut buf[..req.len])?;
                req.len
            }
        };
        result.tensor = host.tensor().f_narrow(0, 0, len as i64)?;
        self.publish(result);
        Ok(())
    }
}

/// Every rank's row count and whether any rank still has batches, from this rank's (`rows`,
/// `more`).
fn counts(
    comm: &dyn Comm,
    p: usize,
    q: usize,
    rows: usize,
    more: bool,
) -> Result<(Vec<usize>, bool)> {
    let mut all = vec![0f32; 2 * p];
    all[2 * q] = rows as f32;
    all[2 * q + 1] = f32::from(u8::from(more));
    comm.all_gather(&mut all, &Parts::even(2 * p, p))?;
    let rows = all.iter().step_by(2).map(|&r| r as usize).collect();
    Ok((rows, all.iter().skip(1).step_by(2).any(|&m| m > 0.0)))
}

/// `f(f(t0, t1), t2) ...` in order.
fn fold(
    ts: Vec<Tensor>,
    f: impl Fn(&Tensor, &Tensor) -> std::result::Result<Tensor, tch::TchError>,
) -> Result<Tensor> {
    let mut it = ts.into_iter();
    let first = it.next().ok_or_else(|| TrainError::Replica {
        replica: 0,
        message: "a head exchange without replicas".into(),
    })?;
    let mut acc = first.f_to_kind(Kind::Float)?;
    for t in it {
        acc = f(&acc, &t)?;
    }
    Ok(acc)
}
