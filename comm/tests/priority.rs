//! The `priority` schedule's agreement: ranks whose buckets become ready in different orders,
//! at different times, still run the same chunks in the same order, every bucket's sum is
//! right, and every rank leaves each step after the same round (no deadlock: the transport's
//! timeout and the channel's fail the test instead of hanging it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use ddl_comm::priority::{Decision, Local, Negotiator};
use ddl_comm::{thread_group_with_timeout, Algorithm, Allreducer, Topology, Transport};

/// (priority, elements) of each bucket: the head first, as backward hands them over.
const BUCKETS: [(usize, usize); 5] = [(3, 37), (2, 8), (2, 21), (1, 5), (0, 30)];
const CHUNK: usize = 7;
const STEPS: usize = 4;
const RANKS: usize = 3;
/// Longest a rank waits for its own producer before the test fails.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a rank's producer (standing in for its replicas) tells its communication loop.
enum Event {
    Ready(usize),
    Done,
}

/// A pseudo-random permutation of the buckets and delays for (rank, step).
fn order(rank: usize, step: usize) -> Vec<(usize, u64)> {
    let mut state = (rank as u64 + 1) * 0x9E37_79B9 + step as u64 * 7919;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut v: Vec<usize> = (0..BUCKETS.len()).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, next() as usize % (i + 1));
    }
    v.into_iter().map(|b| (b, next() % 3)).collect()
}

/// Rank `rank`'s value of element `i` of bucket `b` in step `step`.
fn value(rank: usize, step: usize, b: usize, i: usize) -> f32 {
    ((rank * 31 + step * 17 + b * 7 + i) % 13) as f32
}

struct Rank {
    rank: usize,
    reducer: Allreducer,
    buffers: Vec<Vec<f32>>,
    negotiator: Negotiator,
    /// Steps whose buckets are all complete here.
    completed: Arc<AtomicUsize>,
    complete_in_step: usize,
    decisions: Vec<String>,
    sums: Vec<Vec<Vec<f32>>>,
}

impl Rank {
    /// Reduces a chunk the ranks agreed on; a complete bucket's sum is kept.
    fn reduce(&mut self, bucket: usize, range: std::ops::Range<usize>, last: bool, step: usize) {
        self.decisions.push(format!("{bucket}:{range:?}"));
        let buf = &mut self.buffers[bucket][range];
        self.reducer.allreduce_f32(buf, false).unwrap();
        if last {
            self.sums[step].push(self.buffers[bucket].clone());
            self.complete_in_step += 1;
            if self.complete_in_step == BUCKETS.len() {
                self.complete_in_step = 0;
                self.completed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// One step's loop: serves the previous step's rest and this step's buckets until every
    /// rank is done; returns the step whose chunks are still in flight.
    fn step(&mut self, events: &Receiver<Event>, step: usize) {
        let mut done = false;
        let mut owner = vec![step.saturating_sub(1); BUCKETS.len()];
        let handle = |me: &mut Rank, e: Event, done: &mut bool, owner: &mut Vec<usize>| match e {
            Event::Ready(b) => {
                for (i, x) in me.buffers[b].iter_mut().enumerate() {
                    *x = value(me.rank, step, b, i);
                }
                owner[b] = step;
                me.negotiator.ready(b);
            }
            Event::Done => *done = true,
        };
        loop {
            while let Ok(e) = events.try_recv() {
                handle(self, e, &mut done, &mut owner);
            }
            let reducer = &self.reducer;
            let local = Local {
                done,
                exchange: false,
            };
            let decision = self
                .negotiator
                .negotiate(local, RANKS, |s| reducer.allreduce_f32(s, false))
                .unwrap();
            match decision {
                Decision::Exit => return,
                Decision::Chunk {
                    bucket,
                    range,
                    last,
                } => self.reduce(bucket, range, last, owner[bucket]),
                Decision::Wait if !done => match events.recv_timeout(LOCAL_TIMEOUT) {
                    Ok(e) => handle(self, e, &mut done, &mut owner),
                    Err(RecvTimeoutError::Timeout) => panic!("rank {}: no event", self.rank),
                    Err(RecvTimeoutError::Disconnected) => panic!("producer gone"),
                },
                // Everything here is handed over: the others must catch up.
                Decision::Wait => {}
                Decision::Exchange => panic!("no rank offered an exchange"),
            }
        }
    }
}

fn run_rank(rank: usize, transport: Arc<dyn Transport>) -> (Vec<String>, Vec<Vec<Vec<f32>>>) {
    let reducer = Allreducer::new(transport, Algorithm::Ring, Topology::flat(RANKS)).unwrap();
    let completed = Arc::new(AtomicUsize::new(0));
    let (tx, events) = unbounded();
    let seen = completed.clone();
    // The producer hands over step s's buckets only once step s - 1's are all complete here,
    // as the next forward pass needs them.
    let producer = std::thread::spawn(move || {
        for step in 0..STEPS {
            while seen.load(Ordering::SeqCst) < step {
                std::thread::yield_now();
            }
            for (b, delay) in order(rank, step) {
                std::thread::sleep(Duration::from_millis(delay));
                tx.send(Event::Ready(b)).unwrap();
            }
            tx.send(Event::Done).unwrap();
        }
    });
    let mut me = Rank {
        rank,
        reducer,
        buffers: BUCKETS.iter().map(|&(_, n)| vec![0.0; n]).collect(),
        negotiator: Negotiator::new(BUCKETS, CHUNK),
        completed,
        complete_in_step: 0,
        decisions: Vec::new(),
        sums: vec![Vec::new(); STEPS],
    };
    for step in 0..STEPS {
        me.step(&events, step);
        me.decisions.push("exit".into());
    }
    // The last step's rest, drained in priority order without negotiating.
    while let Some(Decision::Chunk {
        bucket,
        range,
        last,
    }) = me.negotiator.next_rest()
    {
        me.reduce(bucket, range, last, STEPS - 1);
    }
    producer.join().unwrap();
    (me.decisions, me.sums)
}

#[test]
fn ranks_agree_on_every_chunk_and_sum_every_bucket() {
    let group = thread_group_with_timeout(RANKS, Duration::from_secs(30));
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(r, t)| std::thread::spawn(move || run_rank(r, Arc::new(t))))
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let (decisions, sums) = &results[0];
    for (r, (d, s)) in results.iter().enumerate().skip(1) {
        assert_eq!(d, decisions, "rank {r} took other chunks than rank 0");
        assert_eq!(s, sums, "rank {r} has other sums than rank 0");
    }
    // Every step's rounds end with one exit, and every chunk agreed on in a round is a whole
    // chunk or a bucket's last (the final drain takes each rest whole).
    let exits = decisions.iter().filter(|d| *d == "exit").count();
    assert_eq!(exits, STEPS, "{decisions:?}");
    let last_exit = decisions.iter().rposition(|d| d == "exit").unwrap();
    for d in &decisions[..last_exit] {
        let Some((b, range)) = d.split_once(':') else {
            continue;
        };
        let len = BUCKETS[b.parse::<usize>().unwrap()].1;
        let (start, end) = range.split_once("..").unwrap();
        let (start, end): (usize, usize) = (start.parse().unwrap(), end.parse().unwrap());
        assert!(end - start == CHUNK || end == len, "{d} in {decisions:?}");
    }
    for (step, completed) in sums.iter().enumerate() {
        assert_eq!(completed.len(), BUCKETS.len(), "step {step}");
        for got in completed {
            let b = BUCKETS.iter().position(|&(_, n)| n == got.len()).unwrap();
            let want: Vec<f32> = (0..got.len())
                .map(|i| (0..RANKS).map(|r| value(r, step, b, i)).sum())
                .collect();
            assert_eq!(got, &want, "step {step} bucket {b}");
        }
    }
}
