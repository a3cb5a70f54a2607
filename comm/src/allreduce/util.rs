//! Partitioning and buffer-view helpers shared by the algorithms.

use std::ops::Range;

/// Part `i` of `range` cut into `parts` contiguous parts whose lengths differ by at most one
/// (the first `len % parts` parts are one longer).
pub(crate) fn part(range: &Range<usize>, parts: usize, i: usize) -> Range<usize> {
    let n = range.end - range.start;
    let base = n / parts;
    let extra = n % parts;
    let start = range.start + i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

/// A raw view of an f32 buffer handing out byte slices of disjoint element ranges, so one
/// exchange batch can send some chunks of a buffer while receiving into others.
#[derive(Clone, Copy)]
pub(crate) struct RawBuf {
    ptr: *mut f32,
    len: usize,
}

impl RawBuf {
    pub(crate) fn new(buf: &mut [f32]) -> RawBuf {
        RawBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// Pointer to element `offset` (at most the length).
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut f32 {
        assert!(offset <= self.len);
        // SAFETY: within (or one past) the buffer.
        unsafe { self.ptr.add(offset) }
    }

    /// Bytes of elements `r`.
    ///
    /// # Safety
    /// No mutable slice of an overlapping range may be alive at the same time, and the
    /// buffer must outlive the returned slice.
    pub(crate) unsafe fn bytes<'a>(&self, r: Range<usize>) -> &'a [u8] {
        assert!(r.start <= r.end && r.end <= self.len);
        std::slice::from_raw_parts(self.ptr.add(r.start).cast::<u8>(), (r.end - r.start) * 4)
    }

    /// Mutable bytes of elements `r`.
    ///
    /// # Safety
    /// No other slice of an overlapping range may be alive at the same time, and the buffer
    /// must outlive the returned slice.
    pub(crate) unsafe fn bytes_mut<'a>(&self, r: Range<usize>) -> &'a mut [u8] {
        assert!(r.start <= r.end && r.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(r.start).cast::<u8>(), (r.end - r.start) * 4)
    }
}

/// Grows `v` to at least `n` elements (never shrinks, so steady state allocates nothing).
pub(crate) fn ensure_len(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// What a collective probe of the ranks found (a node's shared memory): made on first use, kept
/// whatever it found, so that every rank probes once.
pub(crate) enum Probed<T> {
    /// Not probed yet (or the probe failed: it runs again).
    NotYet,
    /// The ranks do not have it.
    Absent,
    /// Found.
    Found(T),
}

impl<T> Probed<T> {
    /// The thing, probed with `probe` (collectively: every rank calls it at the same point)
    /// if not yet.
    pub(crate) fn get_or_probe(
        &mut self,
        probe: impl FnOnce() -> crate::error::Result<Option<T>>,
    ) -> crate::error::Result<Option<&mut T>> {
        if let Probed::NotYet = self {
            *self = probe()?.map_or(Probed::Absent, Probed::Found);
        }
        Ok(match self {
            Probed::Found(found) => Some(found),
            Probed::NotYet | Probed::Absent => None,
        })
    }
}

/// `buf[i] /= p` (the mean of a sum over `p` ranks).
pub(crate) fn divide(buf: &mut [f32], p: f32) {
    for v in buf.iter_mut() {
        *v /= p;
    }
}
