//! Batches handed to Python without a copy: each array is a view of the Rust batch buffer,
//! exposed through NumPy's array interface, and the buffer goes back to the pipeline's pool
//! when the last array (and every tensor made from it) is freed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ddl_loader::pipeline::{Batch, Images};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A batch lent to Python; counts itself in `held` while alive.
pub struct HeldBatch {
    batch: Batch,
    /// Rows of the batch that belong to the caller (padding rows of an eval batch excluded).
    rows: usize,
    held: Arc<AtomicUsize>,
}

impl HeldBatch {
    /// Lends `batch` (its first `rows` rows) to Python, counting it in `held`.
    pub fn new(batch: Batch, rows: usize, held: Arc<AtomicUsize>) -> Arc<HeldBatch> {
        held.fetch_add(1, Ordering::SeqCst);
        Arc::new(HeldBatch { batch, rows, held })
    }
}

impl Drop for HeldBatch {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which part of a batch an array shows.
#[derive(Clone, Copy)]
pub enum Part {
    /// The pixels, `[rows, 3, S, S]` float32 or `[rows, S, S, 3]` uint8.
    Images,
    /// The labels, `[rows]` int64.
    Labels,
    /// The records' global ids, `[rows]` uint64.
    Indices,
}

/// One part of a batch as an array (NumPy array interface, version 3). `numpy.asarray`
/// makes a view of it and keeps it alive; `torch.from_numpy` of that view keeps the view alive.
#[pyclass(frozen, module = "ddl._ddl")]
pub struct BatchArray {
    held: Arc<HeldBatch>,
    part: Part,
}

impl BatchArray {
    /// The array of `part` of `held`.
    pub fn new(held: Arc<HeldBatch>, part: Part) -> BatchArray {
        BatchArray { held, part }
    }
}

#[pymethods]
impl BatchArray {
    /// NumPy's array interface: shape, type, and the address of the Rust buffer.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = &self.held.batch;
        let rows = self.held.rows;
        let [_, d1, d2, d3] = b.shape();
        let (shape, typestr, ptr): (Vec<usize>, &str, usize) = match self.part {
            Part::Images => match &b.images {
                Images::F32(v) => (vec![rows, d1, d2, d3], "<f4", v.as_ptr() as usize),
                Images::U8(v) => (vec![rows, d1, d2, d3], "|u1", v.as_ptr() as usize),
            },
            Part::Labels => (vec![rows], "<i8", b.labels.as_ptr() as usize),
            Part::Indices => (vec![rows], "<u8", b.indices.as_ptr() as usize),
        };
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, shape)?)?;
        d.set_item("typestr", typestr)?;
        // Writable: torch.from_numpy refuses read-only arrays; nothing else reads the buffer.
        d.set_item("data", (ptr, false))?;
        Ok(d)
    }
}
