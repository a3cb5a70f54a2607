//! Control-plane collectives of bytes over any [`Transport`]: broadcast from rank 0, gather to
//! rank 0 and allgather. They carry configuration, checkpoints, reports and decisions (not
//! gradients: those go through [`crate::Allreducer`]), so they are exact and simple: rank 0
//! talks to every other rank in turn, with the [`tags::CONTROL`] tags. Messages of any length
//! are cut into pieces MPI's `int` counts can carry.

use crate::error::{CommError, Result};
use crate::tags;
use crate::transport::Transport;

/// Tag of a message's length.
const TAG_LEN: u32 = tags::CONTROL.tag(0);
/// Tag of a message's bytes.
const TAG_BODY: u32 = tags::CONTROL.tag(1);
/// Largest single piece of a message.
const MAX_PIECE: usize = 1 << 28;

/// Sends `data` to rank `to`: its length, then its bytes in pieces.
pub fn send_bytes(t: &dyn Transport, to: usize, data: &[u8]) -> Result<()> {
    t.send(to, TAG_LEN, &(data.len() as u64).to_le_bytes())?;
    for piece in data.chunks(MAX_PIECE) {
        t.send(to, TAG_BODY, piece)?;
    }
    Ok(())
}

/// Receives a message that rank `from` sent with [`send_bytes`].
pub fn recv_bytes(t: &dyn Transport, from: usize) -> Result<Vec<u8>> {
    let mut len = [0u8; 8];
    t.recv(from, TAG_LEN, &mut len)?;
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| {
        CommError::InvalidArgument(format!("rank {from} announced a message too large here"))
    })?;
    let mut data = vec![0u8; len];
    for piece in data.chunks_mut(MAX_PIECE) {
        t.recv(from, TAG_BODY, piece)?;
    }
    Ok(data)
}

/// Rank 0's `data` on every rank (bit-exact); the other ranks' argument is ignored.
pub fn broadcast_bytes(t: &dyn Transport, data: Vec<u8>) -> Result<Vec<u8>> {
    broadcast_bytes_from(t, 0, data)
}

/// Rank `root`'s `data` on every rank (bit-exact); the other ranks' argument is ignored.
pub fn broadcast_bytes_from(t: &dyn Transport, root: usize, data: Vec<u8>) -> Result<Vec<u8>> {
    if root >= t.size() {
        return Err(CommError::InvalidArgument(format!(
            "broadcast root {root} is not a rank of a group of {}",
            t.size()
        )));
    }
    if t.rank() != root {
        return recv_bytes(t, root);
    }
    for r in (0..t.size()).filter(|&r| r != root) {
        send_bytes(t, r, &data)?;
    }
    Ok(data)
}

/// Every rank's `data`, in rank order, on rank 0 (`None` on the other ranks).
pub fn gather_bytes(t: &dyn Transport, data: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>> {
    if t.rank() != 0 {
        send_bytes(t, 0, &data)?;
        return Ok(None);
    }
    let mut all = Vec::with_capacity(t.size());
    all.push(data);
    for r in 1..t.size() {
        all.push(recv_bytes(t, r)?);
    }
    Ok(Some(all))
}

/// Every rank's `data` on every rank, in rank order.
pub fn allgather_bytes(t: &dyn Transport, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
    // Rank 0 packs the parts as (u64 length, bytes)* and broadcasts the package.
    let packed = match gather_bytes(t, data)? {
        Some(parts) => {
            let mut out = Vec::with_capacity(parts.iter().map(|p| 8 + p.len()).sum());
            for p in parts {
                out.extend_from_slice(&(p.len() as u64).to_le_bytes());
                out.extend_from_slice(&p);
            }
            out
        }
        None => Vec::new(),
    };
    let packed = broadcast_bytes(t, packed)?;
    let mut parts = Vec::with_capacity(t.size());
    let mut rest = packed.as_slice();
    while let Some((len, tail)) = rest.split_first_chunk::<8>() {
        let len = (u64::from_le_bytes(*len) as usize).min(tail.len());
        parts.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    if parts.len() != t.size() || !rest.is_empty() {
        return Err(CommError::InvalidArgument(format!(
            "allgather: rank 0 sent {} parts for {} ranks",
            parts.len(),
            t.size()
        )));
    }
    Ok(parts)
}

/// Whether every rank of `t` passed `yes` (the same answer on every rank).
pub fn all(t: &dyn Transport, yes: bool) -> Result<bool> {
    let verdict = gather_bytes(t, vec![u8::from(yes)])?
        .map_or(Vec::new(), |v| vec![u8::from(v.iter().all(|b| b == &[1]))]);
    Ok(broadcast_bytes(t, verdict)? == [1])
}

/// Rank 0 gets, per entry, the maximum of `local` over all ranks (the slowest rank's time,
/// say); the other ranks get `local` back.
pub fn max_on_root(t: &dyn Transport, local: &[f64]) -> Result<Vec<f64>> {
    let bytes = local.iter().flat_map(|v| v.to_le_bytes()).collect();
    let Some(all) = gather_bytes(t, bytes)? else {
        return Ok(local.to_vec());
    };
    let mut out = local.to_vec();
    for (rank, part) in all.iter().enumerate().skip(1) {
        if part.len() != 8 * local.len() {
            return Err(CommError::InvalidArgument(format!(
                "max_on_root: rank {rank} sent {} values for {}",
                part.len() / 8,
                local.len()
            )));
        }
        for (o, c) in out.iter_mut().zip(part.chunks_exact(8)) {
            *o = o.max(f64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thread::thread_group;

    /// Runs `f` on every rank of an in-process group of `n` and returns the results in rank
    /// order.
    fn on_ranks<T: Send>(n: usize, f: impl Fn(&dyn Transport) -> T + Sync) -> Vec<T> {
        let group = thread_group(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|t| s.spawn(|| f(t as &dyn Transport)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn payload(rank: usize) -> Vec<u8> {
        (0..rank * 3 + 1).map(|i| (i * 7 + rank) as u8).collect()
    }

    #[test]
    fn broadcast_gives_every_rank_rank_zeros_bytes() {
        for out in on_ranks(3, |t| broadcast_bytes(t, payload(t.rank())).unwrap()) {
            assert_eq!(out, payload(0));
        }
    }

    #[test]
    fn broadcast_from_any_root_gives_every_rank_its_bytes() {
        for root in 0..3 {
            for out in on_ranks(3, |t| {
                broadcast_bytes_from(t, root, payload(t.rank())).unwrap()
            }) {
                assert_eq!(out, payload(root));
            }
        }
        let err = on_ranks(2, |t| broadcast_bytes_from(t, 2, Vec::new()).unwrap_err());
        assert!(err[0].to_string().contains("root 2"), "{}", err[0]);
    }

    #[test]
    fn gather_and_allgather_keep_rank_order() {
        let expected: Vec<Vec<u8>> = (0..4).map(payload).collect();
        let gathered = on_ranks(4, |t| gather_bytes(t, payload(t.rank())).unwrap());
        assert_eq!(gathered[0].as_ref(), Some(&expected));
        assert!(gathered[1..].iter().all(Option::is_none));
        for out in on_ranks(4, |t| allgather_bytes(t, payload(t.rank())).unwrap()) {
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn max_on_root_takes_each_entrys_maximum() {
        let out = on_ranks(3, |t| {
            let r = t.rank() as f64;
            max_on_root(t, &[r, 10.0 - r, 5.0]).unwrap()
        });
        assert_eq!(out[0], vec![2.0, 10.0, 5.0]);
        assert_eq!(out[2], vec![2.0, 8.0, 5.0]);
    }

    #[test]
    fn a_single_rank_gets_its_own_bytes() {
        let out = on_ranks(1, |t| allgather_bytes(t, payload(0)).unwrap());
        assert_eq!(out, vec![vec![payload(0)]]);
    }
}
