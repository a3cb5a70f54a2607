//! The call check: the ranks of one allreduce call compare their [`Signature`]s (the element
//! count and type of their buffers) before any data moves. Ranks that disagree would otherwise sum the wrong elements silently, fail on one
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

use super::signature::Signature;
use crate::error::{CommError, Result};
use crate::transport::Transport;

/// Group sizes whose words are gathered on the stack.
const INLINE_RANKS: usize = 16;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::signature::Dtype;

    #[test]
    fn ranks_that_passed_different_calls_are_named() {
        let a = Signature::new(Dtype::F32, 10);
        let b = Signature::new(Dtype::F32, 1000);
        let c = Signature::new(Dtype::F16, 1000);
        assert!(agree(1, vec![b, b]).is_ok());
        let e = agree(0, vec![a, c]).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 passed 10 f32, rank 1 passed 1000 f16"),
            "{e}"
        );
    }
}
