//! The element types an allreduce accepts (f32, f16, bf16) and the kernels the algorithms run
//! on them: widening to f32, rounding back (to nearest, ties to even) and adding into an f32
//! accumulator. On x86-64 they are compiled for F16C and AVX2 as well as the baseline and pick
//! at run time what the CPU has: faster than the `half` crate's slice conversions
//! (BENCHMARKS.md, "Half precision"), bitwise the same results.

use half::{bf16, f16};

/// Calls kernel `$f` of [`portable`], compiled for AVX2 when the CPU has it.
macro_rules! vectorised {
    ($f:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { x86::$f($($arg),*) };
        }
        portable::$f($($arg),*)
    }};
}

mod sealed {
    use super::Buffer;

    pub trait Sealed: Sized {
        /// The slice as a [`Buffer`] (what a trait object takes).
        fn buffer(buf: &mut [Self]) -> Buffer<'_>;
    }
    impl Sealed for f32 {
        fn buffer(buf: &mut [f32]) -> Buffer<'_> {
            Buffer::F32(buf)
        }
    }
    impl Sealed for half::f16 {
        fn buffer(buf: &mut [half::f16]) -> Buffer<'_> {
            Buffer::F16(buf)
        }
    }
    impl Sealed for half::bf16 {
        fn buffer(buf: &mut [half::bf16]) -> Buffer<'_> {
            Buffer::Bf16(buf)
        }
    }
}

/// A buffer of any [`Element`] type: the algorithms behind [`super::Allreduce`] are trait
/// objects, whose methods cannot be generic; [`with_elements!`] turns it back into a typed
/// slice for generic code. (Public only because the sealed trait names it; nothing outside
/// the crate can reach it.)
pub enum Buffer<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    Bf16(&'a mut [bf16]),
}

/// Evaluates `$body` with `$b` bound to the typed slice of the [`Buffer`] `$buf`.
macro_rules! with_elements {
    ($buf:expr, $b:ident => $body:expr) => {
        match $buf {
            $crate::allreduce::element::Buffer::F32($b) => $body,
            $crate::allreduce::element::Buffer::F16($b) => $body,
            $crate::allreduce::element::Buffer::Bf16($b) => $body,
        }
    };
}
pub(crate) use with_elements;

/// An element type the allreduce accepts: f32, and f16 / bf16 which are widened to f32,
/// reduced in f32 and rounded back once (so the result is the correctly rounded f32 sum).
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The type as the ranks of a call compare it ([`super::signature::Signature`]).
    const DTYPE: super::signature::Dtype;
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Rounds from f32 (round to nearest even).
    fn from_f32(v: f32) -> Self;
    /// The slice itself when the type is f32 (no conversion needed).
    fn as_f32_mut(buf: &mut [Self]) -> Option<&mut [f32]>;
    /// Widens `src` into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// Rounds `src` into `dst` (same length).
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// `acc[i] += src[i]`, widened (same length).
    fn add_to(acc: &mut [f32], src: &[Self]);
}

impl Element for f32 {
    const DTYPE: super::signature::Dtype = super::signature::Dtype::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn as_f32_mut(buf: &mut [Self]) -> Option<&mut [f32]> {
        Some(buf)
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn add_to(acc: &mut [f32], src: &[Self]) {
        add_into(acc, src);
    }
}

impl Element for f16 {
    const DTYPE: super::signature::Dtype = super::signature::Dtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen: lengths differ");
        #[cfg(target_arch = "x86_64")]
        if x86::has_f16c() {
            // SAFETY: the CPU has F16C and AVX; equal lengths.
            return unsafe { x86::widen_f16(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
        #[cfg(target_arch = "x86_64")]
        if x86::has_f16c() {
            // SAFETY: as in `widen`.
            return unsafe { x86::narrow_f16(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(*s);
        }
    }
    fn add_to(acc: &mut [f32], src: &[Self]) {
        assert_eq!(acc.len(), src.len(), "add_to: lengths differ");
        #[cfg(target_arch = "x86_64")]
        if x86::has_f16c() {
            // SAFETY: as in `widen`.
            return unsafe { x86::add_f16(acc, src) };
        }
        for (a, s) in acc.iter_mut().zip(src) {
            *a += s.to_f32();
        }
    }
}

/// bf16 is the top half of an f32: widening is a shift, rounding adds half an ulp (ties to
/// even) and keeps NaNs quiet, as `half` does; plain loops that the compiler vectorises.
impl Element for bf16 {
    const DTYPE: super::signature::Dtype = super::signature::Dtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen: lengths differ");
        vectorised!(widen_bf16(src, dst))
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
        vectorised!(narrow_bf16(src, dst))
    }
    fn add_to(acc: &mut [f32], src: &[Self]) {
        assert_eq!(acc.len(), src.len(), "add_to: lengths differ");
        vectorised!(add_bf16(acc, src))
    }
}

/// `dst[i] += src[i]`.
pub(crate) fn add_into(dst: &mut [f32], src: &[f32]) {
    vectorised!(add_f32(dst, src))
}

/// Kernels written as plain loops: inlined into the AVX2 copies in [`x86`] and used as they
/// are elsewhere.
mod portable {
    use half::bf16;

    #[inline(always)]
    fn bf16_to_f32(v: bf16) -> f32 {
        f32::from_bits(u32::from(v.to_bits()) << 16)
    }

    #[inline(always)]
    fn f32_to_bf16(v: f32) -> bf16 {
        let bits = v.to_bits();
        let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
        let quiet_nan = (bits >> 16) as u16 | 0x40;
        bf16::from_bits(if v.is_nan() { quiet_nan } else { rounded })
    }

    #[inline(always)]
    pub(super) fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_to_f32(*s);
        }
    }

    #[inline(always)]
    pub(super) fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32_to_bf16(*s);
        }
    }

    #[inline(always)]
    pub(super) fn add_bf16(acc: &mut [f32], src: &[bf16]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a += bf16_to_f32(*s);
        }
    }

    #[inline(always)]
    pub(super) fn add_f32(dst: &mut [f32], src: &[f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d += *s;
        }
    }
}

/// The kernels compiled for F16C / AVX2 (callers check the CPU first).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm256_add_ps, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
        _mm256_storeu_ps, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    use half::{bf16, f16};

    use super::portable;

    /// Whether the CPU converts f16 in hardware (F16C, with AVX for 8 lanes).
    pub(super) fn has_f16c() -> bool {
        std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
    }

    /// Whether the CPU has AVX2.
    pub(super) fn has_avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    /// Widens 8 f16 at `src`.
    #[target_feature(enable = "avx,f16c")]
    unsafe fn load8(src: *const f16) -> std::arch::x86_64::__m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(src.cast::<__m128i>()))
    }

    /// # Safety
    /// The CPU has F16C and AVX; `src` and `dst` have the same length.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen_f16(src: &[f16], dst: &mut [f32]) {
        let n = src.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), load8(src.as_ptr().add(i)));
        }
        for (d, s) in dst[n..].iter_mut().zip(&src[n..]) {
            *d = s.to_f32();
        }
    }

    /// # Safety
    /// As [`widen_f16`].
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow_f16(src: &[f32], dst: &mut [f16]) {
        let n = src.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
        }
        for (d, s) in dst[n..].iter_mut().zip(&src[n..]) {
            *d = f16::from_f32(*s);
        }
    }

    /// # Safety
    /// As [`widen_f16`].
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn add_f16(acc: &mut [f32], src: &[f16]) {
        let n = src.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            let a = acc.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                a,
                _mm256_add_ps(_mm256_loadu_ps(a), load8(src.as_ptr().add(i))),
            );
        }
        for (a, s) in acc[n..].iter_mut().zip(&src[n..]) {
            *a += s.to_f32();
        }
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        portable::widen_bf16(src, dst)
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
        portable::narrow_bf16(src, dst)
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_bf16(acc: &mut [f32], src: &[bf16]) {
        portable::add_bf16(acc, src)
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_f32(dst: &mut [f32], src: &[f32]) {
        portable::add_f32(dst, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 values that exercise rounding: every exponent, random mantissas, ties, zeros,
    /// infinities, subnormals and NaNs with payloads.
    fn awkward_f32s() -> Vec<f32> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut v: Vec<f32> = (0..200_000)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                f32::from_bits((state >> 32) as u32)
            })
            .collect();
        // Exact ties between two f16 / bf16 values.
        v.extend((0..4096u32).map(|m| f32::from_bits(0x3f80_0000 | (m << 13) | 0x1000)));
        v.extend((0..4096u32).map(|m| f32::from_bits(0x3f80_0000 | (m << 16) | 0x8000)));
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-40,
            65504.0,
            65520.0,
            f32::MAX,
            f32::from_bits(0x7fc0_0001),
            f32::from_bits(0xff80_0001),
        ]);
        v
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// Every kernel against `half`'s scalar conversions, over lengths that leave every tail.
    fn check<T: Element + PartialEq + std::fmt::Debug>(all: &[T]) {
        let xs = awkward_f32s();
        for len in [0, 1, 7, 8, 9, 31, all.len()] {
            let src = &all[..len];
            let mut wide = vec![0f32; len];
            T::widen(src, &mut wide);
            let want: Vec<f32> = src.iter().map(|v| v.to_f32()).collect();
            assert!(same_bits(&wide, &want), "widen, {len} elements");
            let mut acc: Vec<f32> = (0..len).map(|i| i as f32 * 0.25).collect();
            T::add_to(&mut acc, src);
            let want: Vec<f32> = (0..len).map(|i| i as f32 * 0.25 + want[i]).collect();
            assert!(same_bits(&acc, &want), "add_to, {len} elements");
        }
        for len in [0, 3, 8, 13, xs.len()] {
            let mut out = vec![T::from_f32(0.0); len];
            T::narrow(&xs[..len], &mut out);
            for (x, o) in xs.iter().zip(&out) {
                let want = T::from_f32(*x);
                assert!(
                    o.to_f32().to_bits() == want.to_f32().to_bits()
                        || (x.is_nan() && o.to_f32().is_nan()),
                    "narrow {x:e} ({:#x}): {o:?}, want {want:?}",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn f16_kernels_match_half_on_every_value() {
        check(
            (0..=u16::MAX)
                .map(f16::from_bits)
                .collect::<Vec<_>>()
                .as_slice(),
        );
    }

    #[test]
    fn bf16_kernels_match_half_on_every_value() {
        check(
            (0..=u16::MAX)
                .map(bf16::from_bits)
                .collect::<Vec<_>>()
                .as_slice(),
        );
    }

    #[test]
    fn add_into_adds() {
        let mut a: Vec<f32> = (0..1027).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..1027).map(|i| (i * 3) as f32 - 0.5).collect();
        add_into(&mut a, &b);
        assert!(a
            .iter()
            .enumerate()
            .all(|(i, v)| *v == (i * 4) as f32 - 0.5));
    }
}
