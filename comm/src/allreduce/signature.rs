//! What the ranks of one allreduce call must agree on: the element count and type of their
//! buffers. Ranks that disagree would otherwise sum the wrong elements silently, fail on one
//! rank after the timeout, or crash inside MPI; every algorithm compares the calls of all
//! ranks before it sends any data and fails on every rank with [`CommError::Mismatch`], which
//! names each rank's count and type.
//!
//! Where it can, the check rides on what the call sends anyway: `shm` compares the words in
//! its first synchronisation (they sit on the cache line every rank waits on), and at two
//! ranks the message-based algorithms put the word in front of their first message each way
//! ([`super::first_exchange`]). Otherwise (`mpi`, more ranks, `auto` across nodes) one word
//! per rank is gathered first ([`check_calls`]: an exchange that names a dead rank within the
//! timeout, or MPI_Allgather for `mpi`, which waits without one anyway), a round of its own: a message longer than
//! the receive posted for it is not safe to send, so no data may travel before the lengths
//! are known to agree. Open MPI 4.1 (its shared-memory single-copy path) reported "Read -1,
//! expected 600008" and then corrupted the heap when a rank of 300,000 elements sent its first
//! part to a rank of 1,000. BENCHMARKS.md ("The allreduce call check") has the cost.

use crate::error::{CommError, Result};
use crate::transport::Transport;

/// Bytes of a call's word on the wire (one to every other rank).
pub const CALL_CHECK_WORD: usize = std::mem::size_of::<u64>();

/// Group sizes whose words are gathered on the stack.
const INLINE_RANKS: usize = 16;

/// An element type of the allreduce ([`super::Element`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// f32.
    F32 = 1,
    /// IEEE half precision.
    F16 = 2,
    /// bfloat16.
    Bf16 = 3,
}

impl Dtype {
    /// The name users see (as `ddl-bench --dtype` spells it).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    fn from_code(code: u64) -> Option<Dtype> {
        match code {
            1 => Some(Dtype::F32),
            2 => Some(Dtype::F16),
            3 => Some(Dtype::Bf16),
            _ => None,
        }
    }
}

/// One rank's call: how many elements of which type it reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Elements in the buffer.
    pub count: u64,
    /// Their type.
    pub dtype: Dtype,
}

impl Signature {
    /// The call of a buffer of `count` elements of `dtype`.
    pub fn new(dtype: Dtype, count: usize) -> Signature {
        Signature {
            count: count as u64,
            dtype,
        }
    }

    /// As one word, never 0 (so a word still 0 was never written): the count above the type.
    pub(crate) fn to_word(self) -> u64 {
        (self.count << 8) | self.dtype as u64
    }

    /// The signature of a word written by [`Signature::to_word`], `None` for any other.
    pub(crate) fn from_word(word: u64) -> Option<Signature> {
        Some(Signature {
            count: word >> 8,
            dtype: Dtype::from_code(word & 0xff)?,
        })
    }
}

/// The check as a round of its own: every rank's word gathered
/// ([`Transport::allgather_u64`], or with `native` the transport's own collective, for the
/// `mpi` algorithm), then [`agree`].
pub(crate) fn check_calls(t: &dyn Transport, mine: Signature, native: bool) -> Result<()> {
    let p = t.size();
    let mut inline = [0u64; INLINE_RANKS];
    let mut heap = Vec::new();
    let words: &mut [u64] = if p <= INLINE_RANKS {
        &mut inline[..p]
    } else {
        heap.resize(p, 0);
        &mut heap
    };
    if native {
        t.native_allgather_u64(mine.to_word(), words)?;
    } else {
        t.allgather_u64(mine.to_word(), words)?;
    }
    let me = t.rank();
    if words.iter().all(|&w| w == words[me]) {
        return Ok(());
    }
    let calls: Option<Vec<Signature>> = words.iter().map(|&w| Signature::from_word(w)).collect();
    match calls {
        Some(calls) => agree(me, calls),
        None => Err(CommError::InvalidArgument(format!(
            "allreduce call check on rank {me}: a rank sent a word that is no call"
        ))),
    }
}

/// `Ok` when every rank's call equals `calls[me]`, otherwise the error naming them all.
pub(crate) fn agree(me: usize, calls: Vec<Signature>) -> Result<()> {
    if calls.iter().all(|c| *c == calls[me]) {
        Ok(())
    } else {
        Err(CommError::Mismatch { rank: me, calls })
    }
}

/// The calls grouped by what they passed, in order of first rank: "rank 0 passed 10 f32,
/// ranks 1-3 and 5 passed 1000 f32, rank 4 passed 1000 f16".
pub fn describe_calls(calls: &[Signature]) -> String {
    let mut groups: Vec<(Signature, Vec<usize>)> = Vec::new();
    for (rank, call) in calls.iter().enumerate() {
        match groups.iter_mut().find(|(c, _)| c == call) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((*call, vec![rank])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(call, ranks)| {
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!(
                "{noun} {} passed {} {}",
                rank_list(ranks),
                call.count,
                call.dtype.name()
            )
        })
        .collect();
    parts.join(", ")
}

/// Ascending ranks, runs of three or more as ranges: "0-3, 5, 6 and 9".
fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            runs.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            runs.extend(ranks[i..=j].iter().map(ToString::to_string));
        }
        i = j + 1;
    }
    match runs.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => runs.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_zero_is_no_signature() {
        let s = Signature::new(Dtype::Bf16, 300_000);
        assert_eq!(Signature::from_word(s.to_word()), Some(s));
        assert_eq!(Signature::from_word(0), None);
    }

    #[test]
    fn describes_groups_of_ranks() {
        let a = Signature::new(Dtype::F32, 10);
        let b = Signature::new(Dtype::F32, 1000);
        let c = Signature::new(Dtype::F16, 1000);
        let text = describe_calls(&[a, b, b, b, c, b, a]);
        assert_eq!(
            text,
            "ranks 0 and 6 passed 10 f32, ranks 1-3 and 5 passed 1000 f32, rank 4 passed 1000 f16"
        );
        assert!(agree(1, vec![b, b]).is_ok());
        let e = agree(0, vec![a, c]).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 passed 10 f32, rank 1 passed 1000 f16"),
            "{e}"
        );
    }
}
