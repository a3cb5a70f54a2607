//! The records every node holds in epoch 0: its home records (those of its shards), evened
//! out. Nodes hold `floor(N / P)` or `ceil(N / P)` of a split's `N` records, so that every
//! node takes the same steps and fewer than one global step's records sit out of an epoch;
//! the larger counts go to the nodes with the most home records, so that as few records as
//! possible leave their home node. A node above its count gives its highest ids (the end of
//! its last shards, few shards for its receivers to read); the nodes below take them in node
//! order, each the lowest ids left.

/// Records each node holds given its home records `home` (per node): `floor` or `ceil` of
/// the records over the nodes, the `ceil`s to the nodes with the most home records (ties: the
/// lower node).
pub(super) fn counts(home: &[usize]) -> Vec<usize> {
    let nodes = home.len().max(1);
    let records: usize = home.iter().sum();
    let (each, extra) = (records / nodes, records % nodes);
    let mut order: Vec<usize> = (0..home.len()).collect();
    order.sort_by_key(|&n| (std::cmp::Reverse(home[n]), n));
    let mut counts = vec![each; home.len()];
    for &n in &order[..extra] {
        counts[n] += 1;
    }
    counts
}

/// Every node's records in epoch 0 (ascending) from its home records `home` (ascending) and
/// its count: see the module documentation.
pub(super) fn deal(mut home: Vec<Vec<u32>>, counts: &[usize]) -> Vec<Vec<u32>> {
    let mut pool = Vec::new();
    for (held, &count) in home.iter_mut().zip(counts) {
        if held.len() > count {
            pool.extend(held.drain(count..));
        }
    }
    pool.sort_unstable();
    let mut pool = pool.as_slice();
    for (held, &count) in home.iter_mut().zip(counts) {
        if held.len() < count {
            let (mine, rest) = pool.split_at(count - held.len());
            pool = rest;
            *held = merge(held, mine);
        }
    }
    home
}

/// The union of two ascending lists with no element in common, ascending.
fn merge(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] < b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_counts_go_to_the_nodes_with_the_most_home_records() {
        assert_eq!(counts(&[80, 40]), [60, 60]);
        assert_eq!(counts(&[40, 41, 39]), [40, 40, 40]);
        assert_eq!(counts(&[5, 9, 9, 1]), [6, 6, 6, 6]);
        assert_eq!(counts(&[5, 9, 9, 2]), [6, 7, 6, 6]);
        assert_eq!(counts(&[3, 2, 4]), [3, 3, 3]);
    }

    #[test]
    fn only_the_surplus_moves_and_every_record_stays_once() {
        // Shards [13, 9, 11, 12, 8] on 2 nodes: node 0 holds shards 0, 2, 4 (32 records),
        // node 1 shards 1, 3 (21): 27 and 26 after the deal, 5 of node 0's records move.
        let home = vec![
            (0..13).chain(22..33).chain(45..53).collect::<Vec<u32>>(),
            (13..22).chain(33..45).collect(),
        ];
        let c = counts(&[32, 21]);
        assert_eq!(c, [27, 26]);
        let dealt = deal(home.clone(), &c);
        assert_eq!(dealt[0].len(), 27);
        assert_eq!(dealt[1].len(), 26);
        assert_eq!(dealt[0], home[0][..27]);
        let moved: Vec<u32> = dealt[1]
            .iter()
            .copied()
            .filter(|id| !home[1].contains(id))
            .collect();
        assert_eq!(moved, [48, 49, 50, 51, 52], "node 0's highest ids");
        assert!(dealt.iter().all(|h| h.windows(2).all(|w| w[0] < w[1])));
    }
}
