//! Exact sums for the shared-memory tests: integer-valued inputs sum exactly in any order, so
//! every algorithm must equal the sequential sum (and mean) bitwise on every rank.

use ddl_comm::{Algorithm, Allreducer, Topology};

use crate::common::on_ranks;

/// Integer-valued data: sums are exact in any order.
pub fn input(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729 + salt * 31) % 2001) as f32 - 1000.0)
        .collect()
}

/// Sums and averages [`input`] of each of `lengths` with `algo` over `topo` on in-process
/// ranks, one allreducer for all calls, and checks every rank's results bitwise against the
/// sequential sum and mean.
pub fn check_exact_sums(algo: &Algorithm, topo: Topology, lengths: &[usize]) {
    let p = topo.ranks();
    let (a, sizes) = (algo.clone(), lengths.to_vec());
    let results = on_ranks(p, move |r, t| {
        let ar = Allreducer::new(t, a.clone(), topo).expect("allreducer");
        sizes
            .iter()
            .enumerate()
            .flat_map(|(salt, &len)| {
                let mut sum = input(r, len, salt);
                ar.allreduce_f32(&mut sum, false).expect("sum");
                let mut mean = input(r, len, salt);
                ar.allreduce_f32(&mut mean, true).expect("mean");
                [sum, mean]
            })
            .collect::<Vec<_>>()
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (k, &len) in lengths.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, k)).collect();
        let sum: Vec<f32> = (0..len)
            .map(|i| inputs.iter().map(|v| v[i]).sum())
            .collect();
        let mean: Vec<f32> = sum.iter().map(|v| v / p as f32).collect();
        for (r, res) in results.iter().enumerate() {
            let what = format!("{algo} over {topo:?}, len {len}, rank {r}");
            assert_eq!(bits(&res[2 * k]), bits(&sum), "{what}: sum");
            assert_eq!(bits(&res[2 * k + 1]), bits(&mean), "{what}: mean");
        }
    }
}
