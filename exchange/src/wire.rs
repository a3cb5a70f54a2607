//! Records on the wire between the node leaders: each round, every node sends every peer it
//! still owes records the next piece of them (at most `per_piece` records) and receives the
//! next piece each peer owes it, with the [`EXCHANGE`] tags (a piece's length, then its bytes).
//! Both sides know from the placement which records go where, so the rounds, and the order in
//! which a node stores what it receives ([`arrival_order`]), are the same on every rank.

use ddl_comm::tags::EXCHANGE;
use ddl_comm::{Op, Transport};
use ddl_loader::dataset::Dataset;
use ddl_loader::shard::Record;

use crate::error::{ExchangeError, Result};

/// Tag of a piece's length.
const TAG_LEN: u32 = EXCHANGE.tag(0);
/// Tag of a piece's bytes.
const TAG_BODY: u32 = EXCHANGE.tag(1);
/// Bytes before each record's bytes in a piece: length, label, height, width, crc32c.
const RECORD_HEADER: usize = 16;

/// What one node sends to and receives from each other node in one transfer.
pub(crate) struct Routes<'a> {
    /// This node.
    pub node: usize,
    /// World rank of each node's leader.
    pub leaders: &'a [usize],
    /// Per node: the global ids this node sends it, ascending.
    pub sends: &'a [Vec<u32>],
    /// Per node: the global ids this node receives from it, ascending.
    pub receives: &'a [Vec<u32>],
    /// Records per piece.
    pub per_piece: usize,
}

/// Records and bytes a transfer moved into and out of this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Records received.
    pub records_in: u64,
    /// Bytes of the records received.
    pub bytes_in: u64,
    /// Records sent.
    pub records_out: u64,
    /// Bytes of the records sent.
    pub bytes_out: u64,
}

/// The order a node stores the records it receives in: round by round, peer by peer, each
/// piece's records ascending.
pub(crate) fn arrival_order(receives: &[Vec<u32>], per_piece: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(receives.iter().map(Vec::len).sum());
    let rounds = receives
        .iter()
        .map(|r| r.len().div_ceil(per_piece))
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        for ids in receives {
            let start = (round * per_piece).min(ids.len());
            out.extend_from_slice(&ids[start..(start + per_piece).min(ids.len())]);
        }
    }
    out
}

/// Runs the transfer: sends the records of `source` (this node's shards) that `routes` says,
/// and hands every record received to `sink` with its global id, in [`arrival_order`]. The
/// records received are the sink's to count: `records_in` stays 0.
pub(crate) fn transfer(
    transport: &dyn Transport,
    routes: &Routes<'_>,
    source: &Dataset,
    sink: &mut dyn FnMut(u32, Record<'_>) -> Result<()>,
) -> Result<Moved> {
    let node = routes.node;
    let comm = |source| ExchangeError::Comm { node, source };
    let ids = source.global_ids();
    let mut moved = Moved::default();
    let mut round = 0;
    loop {
        let first = round * routes.per_piece;
        let range =
            |list: &Vec<u32>| first.min(list.len())..(first + routes.per_piece).min(list.len());
        let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
        for (peer, list) in routes.sends.iter().enumerate() {
            if peer != node && !range(list).is_empty() {
                let piece = piece(source, &ids, &list[range(list)], node)?;
                moved.records_out += range(list).len() as u64;
                moved.bytes_out += (piece.len() - range(list).len() * RECORD_HEADER) as u64;
                out.push((peer, piece));
            }
        }
        let from: Vec<usize> = (0..routes.receives.len())
            .filter(|&q| q != node && !range(&routes.receives[q]).is_empty())
            .collect();
        if out.is_empty() && from.is_empty() {
            return Ok(moved);
        }
        let out_lens: Vec<[u8; 8]> = out
            .iter()
            .map(|(_, p)| (p.len() as u64).to_le_bytes())
            .collect();
        let sends: Vec<(usize, &[u8])> = out
            .iter()
            .zip(&out_lens)
            .map(|((peer, _), len)| (*peer, &len[..]))
            .collect();
        let mut in_lens = vec![[0u8; 8]; from.len()];
        let mut recvs: Vec<(usize, &mut [u8])> = from
            .iter()
            .copied()
            .zip(in_lens.iter_mut().map(|b| &mut b[..]))
            .collect();
        swap(transport, routes.leaders, TAG_LEN, &sends, &mut recvs).map_err(comm)?;
        drop(recvs);
        let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(from.len());
        for (&q, len) in from.iter().zip(&in_lens) {
            let len = u64::from_le_bytes(*len);
            let most = range(&routes.receives[q]).len() as u64
                * (RECORD_HEADER as u64 + u64::from(u32::MAX));
            if len > most {
                return Err(corrupt(
                    node,
                    q,
                    format!("a piece of {len} bytes (at most {most})"),
                ));
            }
            bodies.push(vec![0u8; len as usize]);
        }
        let sends: Vec<(usize, &[u8])> = out.iter().map(|(p, piece)| (*p, &piece[..])).collect();
        let mut recvs: Vec<(usize, &mut [u8])> = from
            .iter()
            .copied()
            .zip(bodies.iter_mut().map(Vec::as_mut_slice))
            .collect();
        swap(transport, routes.leaders, TAG_BODY, &sends, &mut recvs).map_err(comm)?;
        drop(recvs);
        for (&q, body) in from.iter().zip(&bodies) {
            let expected = &routes.receives[q][range(&routes.receives[q])];
            moved.bytes_in += unpack(body, expected, node, q, sink)?;
        }
        round += 1;
    }
}

/// Sends each `(node, bytes)` of `sends` to that node's leader and fills each `(node, buf)`
/// of `recvs` from it, all posted at once, with `tag`.
fn swap(
    transport: &dyn Transport,
    leaders: &[usize],
    tag: u32,
    sends: &[(usize, &[u8])],
    recvs: &mut [(usize, &mut [u8])],
) -> ddl_comm::Result<()> {
    let mut ops: Vec<Op<'_>> = sends
        .iter()
        .map(|&(node, data)| Op::Send {
            to: leaders[node],
            tag,
            data,
        })
        .collect();
    ops.extend(recvs.iter_mut().map(|(node, buf)| Op::Recv {
        from: leaders[*node],
        tag,
        buf,
    }));
    transport.exchange(&mut ops)
}

/// The piece of records `send` (global ids) read from `source`, whose ids are `ids`.
fn piece(source: &Dataset, ids: &[u32], send: &[u32], node: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for &id in send {
        let i = ids.binary_search(&id).map_err(|_| ExchangeError::Loader {
            node,
            source: ddl_loader::LoaderError::InvalidConfig(format!(
                "record {id} is to be sent but this node does not hold it"
            )),
        })?;
        let r = source
            .record(i)
            .map_err(|source| ExchangeError::Loader { node, source })?;
        let crc = source.row(i).crc32c;
        out.extend_from_slice(&(r.bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.label.to_le_bytes());
        out.extend_from_slice(&r.height.to_le_bytes());
        out.extend_from_slice(&r.width.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(r.bytes);
    }
    Ok(out)
}

/// Hands the records of piece `body` from node `from` to `sink` as records `expected`,
/// checking each one's length and crc32c; the bytes of the records.
fn unpack(
    body: &[u8],
    expected: &[u32],
    node: usize,
    from: usize,
    sink: &mut dyn FnMut(u32, Record<'_>) -> Result<()>,
) -> Result<u64> {
    let mut at = 0usize;
    let mut bytes = 0u64;
    for &id in expected {
        let head = body
            .get(at..at + RECORD_HEADER)
            .ok_or_else(|| corrupt(node, from, format!("a piece that ends before record {id}")))?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let half = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]);
        let (len, label, height, width, crc) =
            (word(0) as usize, word(4), half(8), half(10), word(12));
        at += RECORD_HEADER;
        let data = body
            .get(at..at + len)
            .ok_or_else(|| corrupt(node, from, format!("record {id} cut short")))?;
        if crc32c::crc32c(data) != crc {
            return Err(corrupt(
                node,
                from,
                format!("record {id} with a wrong crc32c"),
            ));
        }
        at += len;
        bytes += len as u64;
        sink(
            id,
            Record {
                bytes: data,
                label,
                height,
                width,
            },
        )?;
    }
    if at != body.len() {
        return Err(corrupt(
            node,
            from,
            format!("{} bytes after its last record", body.len() - at),
        ));
    }
    Ok(bytes)
}

fn corrupt(node: usize, from: usize, what: String) -> ExchangeError {
    ExchangeError::Corrupt { node, from, what }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_is_round_by_round_then_peer_by_peer() {
        let receives = vec![vec![1, 2, 3], vec![], vec![7, 8, 9, 10, 11]];
        assert_eq!(arrival_order(&receives, 2), [1, 2, 7, 8, 3, 9, 10, 11]);
    }
}
