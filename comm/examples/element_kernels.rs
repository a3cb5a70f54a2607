//! ddl's f16 / bf16 kernels (`ddl_comm::Element`) against the `half` crate's slice
//! conversions, on slices of 4,096 elements that stay in L1: nanoseconds per element, the
//! fastest of 201 repetitions, the two taking turns.
//!
//!     cargo run --release -p ddl-comm --example element_kernels

use std::hint::black_box;
use std::time::Instant;

use ddl_comm::{bf16, f16, Element};
use half::slice::HalfFloatSliceExt;

const N: usize = 4096;
const REPS: usize = 201;

/// Nanoseconds per element of `a` and `b` on `out`, each the fastest of [`REPS`], taking
/// turns.
fn race<O>(out: &mut O, a: impl Fn(&mut O), b: impl Fn(&mut O)) -> (f64, f64) {
    let (mut best_a, mut best_b) = (f64::MAX, f64::MAX);
    for _ in 0..REPS {
        let t = Instant::now();
        a(black_box(&mut *out));
        best_a = best_a.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b(black_box(&mut *out));
        best_b = best_b.min(t.elapsed().as_secs_f64());
    }
    (best_a * 1e9 / N as f64, best_b * 1e9 / N as f64)
}

fn print(kernel: &str, (half, ddl): (f64, f64)) {
    println!("| {kernel} | {half:.3} | {ddl:.3} | {:.1}x |", half / ddl);
}

/// The three kernels of element type `T` against `half`'s slice conversions (for `add_to`:
/// widening into a scratch slice, then adding).
fn kernels<T>(name: &str)
where
    T: Element,
    [T]: HalfFloatSliceExt,
{
    let values: Vec<T> = (0..N)
        .map(|i| T::from_f32(i as f32 * 0.37 - 700.0))
        .collect();
    let mut wide = vec![0f32; N];
    let mut narrow = vec![T::from_f32(0.0); N];
    let mut acc = (vec![0f32; N], vec![0f32; N]);
    print(
        &format!("{name} widen"),
        race(
            &mut wide,
            |w| values.convert_to_f32_slice(w),
            |w| T::widen(&values, w),
        ),
    );
    print(
        &format!("{name} narrow"),
        race(
            &mut narrow,
            |n| n.convert_from_f32_slice(&wide),
            |n| T::narrow(&wide, n),
        ),
    );
    print(
        &format!("{name} add into f32"),
        race(
            &mut acc,
            |(acc, scratch)| {
                values.convert_to_f32_slice(scratch);
                for (a, s) in acc.iter_mut().zip(scratch.iter()) {
                    *a += s;
                }
            },
            |(acc, _)| T::add_to(acc, &values),
        ),
    );
}

fn main() {
    println!("| kernel | half 2 (ns/element) | ddl (ns/element) | speed-up |");
    println!("|---|---|---|---|");
    kernels::<f16>("f16");
    kernels::<bf16>("bf16");
}
