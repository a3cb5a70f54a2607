//! What a rank records of an epoch: the accumulated step figures ([`EpochAcc`]), the
//! epoch's [`EpochRecord`] over all ranks (its record exchange included), and the line
//! printed for it.

use std::time::Duration;

use super::checkpoints::{bytes_to_u64s, u64s_to_bytes};
use super::run::Run;
use crate::error::Result;
use crate::metrics::{EpochRecord, ExchangeRecord};
use crate::table::EvalSums;

/// The line printed after each epoch.
pub(super) fn epoch_line(r: &EpochRecord) -> String {
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0));
    let mut line = format!(
        "epoch {:>3}  train loss {}  val top-1 {}  top-5 {}  {:.1} images/s  data-wait {:.1}%  allreduce {:.1}%  ({:.1} s)",
        r.epoch,
        r.train_loss.map_or("-".to_string(), |l| format!("{l:.4}")),
        pct(r.val_top1),
        pct(r.val_top5),
        r.images_per_s,
        r.data_wait_frac * 100.0,
        r.allreduce_frac * 100.0,
        r.epoch_s,
    );
    if let Some(x) = &r.exchange {
        line.push_str(&format!(
            "  exchanged {} records ({:.1} MB, waited {:.2} s)",
            x.records,
            x.bytes as f64 / 1e6,
            x.wait_s
        ));
    }
    let val_bad = r.val_bad_records.unwrap_or(0);
    if r.bad_records + val_bad > 0 {
        line.push_str(&format!(
            "  bad records: {} in training, {val_bad} left out of val",
            r.bad_records
        ));
    }
    line
}

impl Run<'_> {
    /// The epoch's record over all ranks: its training figures `acc`, wall time and
    /// evaluation. Collective.
    pub(super) fn epoch_record(
        &self,
        epoch: u64,
        acc: &EpochAcc,
        epoch_s: Duration,
        val: Option<EvalSums>,
    ) -> Result<EpochRecord> {
        let wall = acc.wall.max(1e-9);
        let mut buf = [
            acc.loss as f32,
            acc.steps as f32,
            acc.images as f32,
            (acc.data_wait / wall) as f32,
            (acc.allreduce / wall) as f32,
            acc.bad_records as f32,
        ];
        self.comm.allreduce_sum(&mut buf)?;
        let world = self.comm.size() as f64;
        let steps = f64::from(buf[1]);
        let val_bad_records = val.map(|v| v.skipped as u64);
        let val = val.filter(|v| v.count > 0.0);
        Ok(EpochRecord {
            kind: "epoch",
            epoch,
            // A run resumed at an epoch's end trained no step of it.
            train_loss: (steps > 0.0).then(|| f64::from(buf[0]) / steps),
            val_loss: val.map(|v| v.loss / v.count),
            val_top1: val.map(|v| v.top1 / v.count),
            val_top5: val.map(|v| v.top5 / v.count),
            val_images: val.map(|v| v.count as u64),
            epoch_s: secs(epoch_s),
            images_per_s: f64::from(buf[2]) / secs(epoch_s).max(1e-9),
            data_wait_frac: f64::from(buf[3]) / world,
            allreduce_frac: f64::from(buf[4]) / world,
            steps: acc.steps,
            bad_records: buf[5] as u64,
            val_bad_records,
            image_size: self.cfg.train_size(epoch),
            exchange: self.exchange_record()?,
        })
    }

    /// What the record exchange into the epoch being trained moved, over all nodes; `None`
    /// without an exchange. Collective.
    fn exchange_record(&self) -> Result<Option<ExchangeRecord>> {
        let Some(last) = self.exchange.as_ref().map(|x| x.last().unwrap_or_default()) else {
            return Ok(None);
        };
        let mine = u64s_to_bytes(&[
            last.moved.records_in,
            last.moved.bytes_in,
            last.transfer_s.to_bits(),
            last.wait_s.to_bits(),
        ]);
        let mut total = ExchangeRecord::default();
        for v in self.comm.allgather_bytes(mine)? {
            let v = bytes_to_u64s(&v);
            total.records += v[0];
            total.bytes += v[1];
            total.transfer_s = total.transfer_s.max(f64::from_bits(v[2]));
            total.wait_s = total.wait_s.max(f64::from_bits(v[3]));
        }
        Ok(Some(total))
    }
}

/// The figures of an epoch's steps on this rank.
#[derive(Default)]
pub(super) struct EpochAcc {
    loss: f64,
    steps: u64,
    images: f64,
    wall: f64,
    data_wait: f64,
    allreduce: f64,
    bad_records: u64,
}

impl EpochAcc {
    pub(super) fn add(&mut self, s: &crate::table::StepStats) {
        self.loss += s.loss;
        self.steps += 1;
        self.images += s.images as f64;
        self.wall += secs(s.wall);
        self.data_wait += secs(s.data_wait);
        self.allreduce += secs(s.allreduce);
        self.bad_records += s.bad_records as u64;
    }
}

/// `d` in seconds.
pub(super) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
