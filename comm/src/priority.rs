//! The order in which a communication thread reduces a training step's gradient buckets
//! (`ddl-train --comm-order`, `ddl.dist.DistributedOptimizer(comm_order=...)`), and the
//! agreement that keeps that order the same on every rank.
//!
//! `fifo` reduces each bucket whole, in the order backward hands them over: the last layers'
//! first, the first layers' last. Every rank runs the same model, so every rank hands them over
//! in the same order and no agreement is needed. But the next forward pass needs the first
//! layers' weights first, and on a link-bound cluster it waits for the whole allreduce.
//!
//! `priority` (Intel's MLSL, arXiv:1801.08030) reduces the bucket of the lowest model stage
//! first and cuts buckets into chunks, so that the first layers' bucket, handed over last,
//! overtakes the chunks of the head's bucket still queued, and the next forward can start its
//! first stages while the later stages' buckets are still on the wire. Which bucket is ready
//! first then differs per rank and per run, and collectives must run in the same order on every
//! rank: a local priority queue would pair different buckets across ranks. So while buckets are
//! being handed over, the ranks agree before each chunk on the next operation with one
//! allreduce of a few floats of local state ([`Negotiator::negotiate`]: per bucket, ready here
//! or not; "my step is done"; "an exchange is waiting here"), and every rank derives the same
//! [`Decision`] from the sums, as Horovod's coordinator does with its ready lists. How a bucket
//! is cut is the same on every rank, and so is which chunks have been reduced, since every
//! chunk is a collective. Once every rank has handed its step over, the rest needs no rounds:
//! [`Negotiator::next_rest`] takes it in priority order, each bucket's rest whole.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::error::{CommError, Result};

/// How a communication thread orders a step's buckets (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommOrder {
    /// Each bucket whole, in the order backward hands them over; no agreement needed.
    Fifo,
    /// The lowest stage first, in chunks of `chunk_bytes`, each agreed on by all ranks.
    Priority {
        /// Bytes of f32 per chunk (at least 4).
        chunk_bytes: usize,
    },
}

impl CommOrder {
    /// Names accepted by `FromStr` (`priority` also as `priority:CHUNK_BYTES`).
    pub const NAMES: [&'static str; 2] = ["fifo", "priority"];

    /// Default chunk of `priority`, in bytes: long enough that the round before each chunk
    /// costs little beside it, short enough that a first layer's bucket handed over behind a
    /// large one waits for little (BENCHMARKS.md, "Communication priorities", has the
    /// simulator's step at 1, 4 and 16 MiB).
    pub const PRIORITY_CHUNK_BYTES: usize = 4 << 20;

    /// `priority` with the default chunk.
    pub const PRIORITY: CommOrder = CommOrder::Priority {
        chunk_bytes: CommOrder::PRIORITY_CHUNK_BYTES,
    };

    /// Its name without parameters: `fifo` or `priority`.
    pub fn name(&self) -> &'static str {
        match self {
            CommOrder::Fifo => "fifo",
            CommOrder::Priority { .. } => "priority",
        }
    }
}

impl fmt::Display for CommOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommOrder::Fifo => f.write_str("fifo"),
            CommOrder::Priority { chunk_bytes }
                if *chunk_bytes == CommOrder::PRIORITY_CHUNK_BYTES =>
            {
                f.write_str("priority")
            }
            CommOrder::Priority { chunk_bytes } => write!(f, "priority:{chunk_bytes}"),
        }
    }
}

impl FromStr for CommOrder {
    type Err = CommError;

    /// Parses `fifo`, `priority` and `priority:CHUNK_BYTES`.
    fn from_str(s: &str) -> Result<Self> {
        let mut it = s.trim().splitn(2, ':');
        match (it.next().unwrap_or(""), it.next()) {
            ("fifo", None) => Ok(CommOrder::Fifo),
            ("priority", None) => Ok(CommOrder::PRIORITY),
            ("priority", Some(c)) => match c.parse::<usize>() {
                Ok(chunk_bytes) if chunk_bytes >= 4 => Ok(CommOrder::Priority { chunk_bytes }),
                _ => Err(CommError::InvalidArgument(format!(
                    "priority: chunk bytes {c:?} is not an integer of at least 4"
                ))),
            },
            _ => Err(CommError::InvalidArgument(format!(
                "unknown communication order {s:?} (expected fifo, priority or \
                 priority:CHUNK_BYTES)"
            ))),
        }
    }
}

/// What the ranks agreed to do next; every rank derives the same from the same sums.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every rank has an exchange waiting (the trainer's head exchange of `--head-parallel`):
    /// run it first, the replicas of every rank are blocked on it.
    Exchange,
    /// Every rank is done with its step: leave the loop, all ranks after the same number of
    /// rounds, so that the collectives that follow stay in order.
    Exit,
    /// Allreduce elements `range` of bucket `bucket`; `last`: this chunk completes it.
    Chunk {
        /// The bucket.
        bucket: usize,
        /// Its elements this chunk covers.
        range: Range<usize>,
        /// Whether the bucket is complete after this chunk.
        last: bool,
    },
    /// Nothing is ready on every rank: wait for something to change here (when something can)
    /// and negotiate again.
    Wait,
}

/// What a rank reports in a negotiation besides its ready buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Local {
    /// Its step is done (every bucket of it handed over).
    pub done: bool,
    /// An exchange is waiting here.
    pub exchange: bool,
}

/// One bucket in the schedule.
#[derive(Clone, Debug)]
struct Slot {
    /// Lower goes first (the trainer: the model stage).
    priority: usize,
    /// Elements.
    len: usize,
    /// Elements reduced so far of the instance in flight.
    reduced: usize,
    /// Handed over here and not yet complete.
    ready: bool,
}

/// One rank's view of the buckets of a `priority` schedule: which are ready here, how far each
/// is reduced, and the negotiation that picks the next chunk (see the module doc). A bucket
/// holds one instance at a time: once complete it may be handed over again (the next step).
#[derive(Clone, Debug)]
pub struct Negotiator {
    slots: Vec<Slot>,
    /// Bucket indices, highest priority first (ties: the lower index).
    order: Vec<usize>,
    chunk: usize,
    state: Vec<f32>,
}

/// Floats of state before the per-bucket flags: the exchange and the done flags.
const HEADER: usize = 2;

impl Negotiator {
    /// The buckets as `(priority, elements)` in bucket order, cut into chunks of `chunk`
    /// elements (at least 1).
    pub fn new(buckets: impl IntoIterator<Item = (usize, usize)>, chunk: usize) -> Negotiator {
        let slots: Vec<Slot> = buckets
            .into_iter()
            .map(|(priority, len)| Slot {
                priority,
                len,
                reduced: 0,
                ready: false,
            })
            .collect();
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_by_key(|&b| (slots[b].priority, b));
        let state = vec![0.0; HEADER + slots.len()];
        Negotiator {
            slots,
            order,
            chunk: chunk.max(1),
            state,
        }
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.slots.len()
    }

    /// Bucket `bucket` is handed over here: its values are in place until it is complete.
    pub fn ready(&mut self, bucket: usize) {
        self.slots[bucket].ready = true;
    }

    /// Whether `bucket` is handed over here and not yet complete.
    pub fn is_ready(&self, bucket: usize) -> bool {
        self.slots[bucket].ready
    }

    /// Whether any bucket handed over here is not yet complete.
    pub fn any_ready(&self) -> bool {
        self.slots.iter().any(|s| s.ready)
    }

    /// Whether bucket `bucket` has had a chunk reduced (its first chunk is behind it).
    pub fn started(&self, bucket: usize) -> bool {
        self.slots[bucket].reduced > 0
    }

    /// Agrees with every other rank of `ranks` on the next operation: sums this rank's state
    /// with `allreduce` (a sum over the ranks, in place, every rank calling it at the same
    /// round) and decides from the sums. A chunk it returns is taken: the caller must reduce
    /// it.
    pub fn negotiate<E>(
        &mut self,
        local: Local,
        ranks: usize,
        allreduce: impl FnOnce(&mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<Decision, E> {
        self.state[0] = f32::from(u8::from(local.exchange));
        self.state[1] = f32::from(u8::from(local.done));
        for (s, slot) in self.state[HEADER..].iter_mut().zip(&self.slots) {
            *s = f32::from(u8::from(slot.ready));
        }
        allreduce(&mut self.state)?;
        // Counts up to 2^24 ranks are exact in f32.
        let everywhere = |x: f32| x == ranks as f32;
        if everywhere(self.state[0]) {
            return Ok(Decision::Exchange);
        }
        if everywhere(self.state[1]) {
            return Ok(Decision::Exit);
        }
        let next = self
            .order
            .iter()
            .copied()
            .find(|&b| everywhere(self.state[HEADER + b]));
        Ok(match next {
            Some(bucket) => self.take(bucket),
            None => Decision::Wait,
        })
    }

    /// What is left of the highest-priority bucket ready here, whole (one chunk to its end),
    /// taken without negotiating: for draining, when every rank is known to hold every bucket
    /// it has not completed (the same on every rank, as the reduced chunks are) and no other
    /// bucket can come before the drain ends, so that cutting the rest would only add calls.
    /// `None` when none is ready.
    pub fn next_rest(&mut self) -> Option<Decision> {
        let bucket = self.order.iter().copied().find(|&b| self.slots[b].ready)?;
        let slot = &mut self.slots[bucket];
        let range = slot.reduced..slot.len;
        slot.reduced = 0;
        slot.ready = false;
        Some(Decision::Chunk {
            bucket,
            range,
            last: true,
        })
    }

    /// Takes the next chunk of `bucket`.
    fn take(&mut self, bucket: usize) -> Decision {
        let slot = &mut self.slots[bucket];
        let start = slot.reduced;
        let end = (start + self.chunk).min(slot.len);
        let last = end == slot.len;
        if last {
            slot.reduced = 0;
            slot.ready = false;
        } else {
            slot.reduced = end;
        }
        Decision::Chunk {
            bucket,
            range: start..end,
            last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_parse_and_print() {
        assert_eq!("fifo".parse::<CommOrder>().unwrap(), CommOrder::Fifo);
        assert_eq!(
            "priority".parse::<CommOrder>().unwrap(),
            CommOrder::PRIORITY
        );
        let p: CommOrder = "priority:65536".parse().unwrap();
        assert_eq!(p, CommOrder::Priority { chunk_bytes: 65536 });
        for s in ["fifo", "priority", "priority:65536"] {
            assert_eq!(s.parse::<CommOrder>().unwrap().to_string(), s);
        }
        for bad in ["lifo", "priority:2", "priority:x", "fifo:3"] {
            let e = bad.parse::<CommOrder>().unwrap_err().to_string();
            assert!(
                e.contains(bad.split(':').next_back().unwrap()),
                "{bad}: {e}"
            );
        }
    }

    /// One rank alone: the sums are its own state.
    fn alone(n: &mut Negotiator, local: Local) -> Decision {
        n.negotiate(local, 1, |_| Ok::<(), CommError>(())).unwrap()
    }

    #[test]
    fn the_lowest_stage_goes_first_and_overtakes_a_started_bucket() {
        // Bucket 0: the head (stage 2, 10 elements), 1: stage 1, 2: the stem (stage 0).
        let mut n = Negotiator::new([(2, 10), (1, 3), (0, 5)], 4);
        assert_eq!(alone(&mut n, Local::default()), Decision::Wait);
        n.ready(0);
        let chunk = |bucket, range, last| Decision::Chunk {
            bucket,
            range,
            last,
        };
        assert_eq!(alone(&mut n, Local::default()), chunk(0, 0..4, false));
        n.ready(2);
        n.ready(1);
        assert_eq!(alone(&mut n, Local::default()), chunk(2, 0..4, false));
        assert_eq!(alone(&mut n, Local::default()), chunk(2, 4..5, true));
        assert_eq!(alone(&mut n, Local::default()), chunk(1, 0..3, true));
        assert_eq!(alone(&mut n, Local::default()), chunk(0, 4..8, false));
        // Done and an exchange come before the rest; done before chunks.
        let both = Local {
            done: true,
            exchange: true,
        };
        assert_eq!(alone(&mut n, both), Decision::Exchange);
        let done = Local {
            done: true,
            exchange: false,
        };
        assert_eq!(alone(&mut n, done), Decision::Exit);
        n.ready(2);
        assert_eq!(alone(&mut n, Local::default()), chunk(2, 0..4, false));
        // A drain takes the rests whole, the highest priority first.
        assert_eq!(n.next_rest(), Some(chunk(2, 4..5, true)));
        assert_eq!(n.next_rest(), Some(chunk(0, 8..10, true)));
        assert_eq!(n.next_rest(), None);
        assert!(!n.any_ready());
        // A complete bucket can come again (the next step).
        n.ready(0);
        assert_eq!(alone(&mut n, Local::default()), chunk(0, 0..4, false));
    }
}
