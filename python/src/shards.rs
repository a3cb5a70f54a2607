//! `ddl._ddl.Shards`: map-style access to the records of one split, for users who bring their
//! own transforms.

use std::path::PathBuf;

use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::loader_error;

/// Every record of one split, memory-mapped (all shards, whatever the node count).
#[pyclass(frozen, module = "ddl._ddl")]
pub struct Shards {
    dataset: Dataset,
    classes: Vec<String>,
}

#[pymethods]
impl Shards {
    /// Maps every shard of `split` in `path`, checking headers, indexes and sizes.
    #[new]
    fn new(py: Python<'_>, path: PathBuf, split: String) -> PyResult<Shards> {
        let dataset = py
            .detach(|| {
                Dataset::open(
                    &path,
                    &split,
                    Residency { node: 0, nodes: 1 },
                    &OpenOptions::default(),
                )
            })
            .map_err(loader_error)?;
        let classes = dataset
            .manifest()
            .classes
            .iter()
            .map(|c| c.wnid.clone())
            .collect();
        Ok(Shards { dataset, classes })
    }

    fn __len__(&self) -> usize {
        self.dataset.len()
    }

    /// Record `i` as `(jpeg bytes, label, height, width)`; its checksum is checked.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        i: isize,
    ) -> PyResult<(Bound<'py, PyBytes>, u32, u16, u16)> {
        let n = self.dataset.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(PyIndexError::new_err(format!(
                "record {i} out of range for {n} records"
            )));
        }
        let r = self.dataset.record(j as usize).map_err(loader_error)?;
        Ok((PyBytes::new(py, r.bytes), r.label, r.height, r.width))
    }

    /// The class wnids in label order.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.classes.clone()
    }

    /// The shard files, in split order.
    #[getter]
    fn files(&self) -> Vec<PathBuf> {
        self.dataset
            .shard_paths()
            .into_iter()
            .map(PathBuf::from)
            .collect()
    }

    /// Checks every record's checksum; returns `(file, record, reason)` for each damaged one.
    fn verify(&self, py: Python<'_>) -> Vec<(String, usize, String)> {
        py.detach(|| {
            (0..self.dataset.len())
                .filter_map(|i| {
                    self.dataset.record(i).err().map(|e| {
                        let (reader, k) = self.dataset.locate(i);
                        (reader.path().display().to_string(), k, e.to_string())
                    })
                })
                .collect()
        })
    }
}
