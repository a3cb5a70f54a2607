//! A compiled step package loaded by libtorch's AOTInductor loader (`package.cpp`), its
//! constants bound to a replica's own tensors.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::entry::{Described, TensorSpec};
use super::graph::{CudaGraph, GraphLibrary};
use crate::error::{Result, TrainError};

extern "C" {
    fn ddl_free_error(e: *mut c_char);
    fn ddl_aoti_load(path: *const c_char, device_index: i64, out: *mut *mut c_void) -> *mut c_char;
    fn ddl_aoti_free(loader: *mut c_void);
    fn ddl_aoti_constant_names(loader: *mut c_void, out: *mut *mut c_char) -> *mut c_char;
    fn ddl_aoti_bind(
        loader: *mut c_void,
        names: *const *const c_char,
        tensors: *const *mut c_void,
        n: i64,
    ) -> *mut c_char;
    fn ddl_aoti_run(
        loader: *mut c_void,
        inputs: *const *mut c_void,
        n: i64,
        outputs: *mut *mut c_void,
        capacity: i64,
        count: *mut i64,
    ) -> *mut c_char;
}

/// Takes the C++ side's message, if any (and frees it).
fn check(e: *mut c_char, what: &str) -> Result<()> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string from strdup, freed once here.
    let message = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
    unsafe { ddl_free_error(e) };
    Err(TrainError::Compile(format!("{what}: {message}")))
}

fn raw(t: &Tensor) -> *mut c_void {
    t.as_ptr() as *mut c_void
}

/// The package's name of the flat gradient buffer it writes.
const FLAT_GRAD: &str = "flat_grad";
/// The prefix of the network's constants in the package.
const NET: &str = "net.";

/// Plain runs of a package before its CUDA graph is captured: the first runs initialize
/// cuDNN and choose its algorithms (benchmark mode), which capture must not see.
const WARMUP_RUNS: usize = 2;

/// How a package runs: plainly, or replayed from a CUDA graph once warmed up.
enum Graph {
    Off,
    /// Runs plainly `runs` times so far, then captures with `library`.
    Warming {
        library: Arc<GraphLibrary>,
        runs: usize,
    },
    /// The graph, the static slots it reads its batch from and writes its loss to, and the
    /// run it was captured at.
    Captured {
        graph: CudaGraph,
        images: Tensor,
        labels: Tensor,
        loss: Tensor,
        at: u64,
    },
}

/// A loaded step package. Not `Sync`: one per replica thread.
pub struct StepPackage {
    loader: *mut c_void,
    described: Described,
    /// The CUDA device it runs on (`None`: the CPU).
    gpu: Option<usize>,
    /// The loss scale the package multiplies the loss by, as an input on the device.
    loss_scale: Tensor,
    scale: f64,
    graph: Graph,
    /// Runs so far (plain or replayed).
    runs: u64,
}

// SAFETY: the loader is owned by one replica at a time; AOTInductor's container may be used
// from any thread.
unsafe impl Send for StepPackage {}

impl StepPackage {
    /// Loads `package` (described by `described`) for `device`.
    pub fn load(package: &Path, described: Described, device: Device) -> Result<StepPackage> {
        let gpu = match device {
            Device::Cuda(i) => Some(i),
            _ => None,
        };
        let index = gpu.map_or(-1, |i| i as i64);
        let path = CString::new(package.as_os_str().as_encoded_bytes()).map_err(|_| {
            TrainError::Compile(format!("{}: a NUL in the path", package.display()))
        })?;
        let mut loader = std::ptr::null_mut();
        // SAFETY: a NUL-terminated path and a valid destination.
        check(
            unsafe { ddl_aoti_load(path.as_ptr(), index, &mut loader) },
            &format!("loading {}", package.display()),
        )?;
        Ok(StepPackage {
            loader,
            described,
            gpu,
            loss_scale: Tensor::f_ones([], (Kind::Float, device))?,
            scale: 1.0,
            graph: Graph::Off,
            runs: 0,
        })
    }

    /// Replays the step from a CUDA graph (captured with `library` after a few plain runs);
    /// refused on the CPU.
    pub fn use_cuda_graphs(&mut self, library: Arc<GraphLibrary>) -> Result<()> {
        if self.gpu.is_none() {
            return Err(TrainError::Compile(
                "CUDA graphs need a GPU; this step runs on the CPU".into(),
            ));
        }
        self.graph = Graph::Warming { library, runs: 0 };
        Ok(())
    }

    /// The constants the package reads or writes, as its loader lists them.
    fn constant_names(&self) -> Result<BTreeSet<String>> {
        let mut out = std::ptr::null_mut();
        // SAFETY: a live loader and a valid destination; `out` is freed below.
        check(
            unsafe { ddl_aoti_constant_names(self.loader, &mut out) },
            "listing the package's constants",
        )?;
        let all = unsafe { CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        unsafe { ddl_free_error(out) };
        Ok(all.lines().map(str::to_owned).collect())
    }

    /// Binds the package's constants to `named` (every parameter and buffer of the model, by
    /// name) and `flat_grad` (the replica's flat gradients), after checking that each is one
    /// the package reads or writes, with the shape, strides and dtype it was compiled for.
    /// A parameter or buffer the package does not list was folded into its code: the package
    /// would compute with the value it had when compiled, whatever ddl's updates, so it is
    /// refused by name.
    pub fn bind(&mut self, named: &[(String, Tensor)], flat_grad: &Tensor) -> Result<()> {
        let listed = self.constant_names()?;
        let specs: BTreeMap<&str, &TensorSpec> = self
            .described
            .constants
            .iter()
            .map(|c| (c.fqn.as_str(), c))
            .collect();
        let mut binding: Vec<(String, &Tensor)> = vec![(FLAT_GRAD.to_string(), flat_grad)];
        binding.extend(named.iter().map(|(n, t)| (format!("{NET}{n}"), t)));
        let folded: Vec<&str> = binding
            .iter()
            .filter(|(fqn, _)| !listed.contains(fqn))
            .map(|(fqn, _)| fqn.strip_prefix(NET).unwrap_or(fqn))
            .collect();
        if !folded.is_empty() {
            return Err(TrainError::Compile(format!(
                "the compiled step does not read {} as a tensor (folded into its code as a \
                 constant, so ddl's updates to it would be ignored); it cannot train this model",
                folded.join(", ")
            )));
        }
        let ours: BTreeSet<&str> = binding.iter().map(|(f, _)| f.as_str()).collect();
        let unknown: Vec<&str> = listed
            .iter()
            .map(String::as_str)
            .filter(|f| !ours.contains(f))
            .collect();
        if !unknown.is_empty() {
            return Err(TrainError::Compile(format!(
                "the compiled step reads constants ddl's model does not have: {}",
                unknown.join(", ")
            )));
        }
        for (fqn, t) in &binding {
            let spec = specs.get(fqn.as_str()).ok_or_else(|| {
                TrainError::Compile(format!("step.json does not describe the constant {fqn}"))
            })?;
            spec.check(fqn, t)?;
        }
        let names: Vec<CString> = binding
            .iter()
            .map(|(f, _)| CString::new(f.as_str()).expect("names have no NUL"))
            .collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let tensors: Vec<*mut c_void> = binding.iter().map(|(_, t)| raw(t)).collect();
        // SAFETY: two arrays of the same length, of NUL-terminated names and live tensors.
        check(
            unsafe {
                ddl_aoti_bind(
                    self.loader,
                    name_ptrs.as_ptr(),
                    tensors.as_ptr(),
                    names.len() as i64,
                )
            },
            "binding the compiled step's constants",
        )
    }

    /// Runs one step on `images` and `labels` with the loss multiplied by `loss_scale`:
    /// writes the gradients into the bound flat buffer, updates the running statistics in
    /// place and returns the unscaled loss (a 0-dim tensor on the device; from a CUDA graph,
    /// its static slot, which the next step overwrites).
    pub fn run(&mut self, images: &Tensor, labels: &Tensor, loss_scale: f64) -> Result<Tensor> {
        self.runs += 1;
        let inputs = &self.described.inputs;
        inputs[0].check("images", images)?;
        inputs[1].check("labels", labels)?;
        if loss_scale != self.scale {
            let _ = self.loss_scale.f_fill_(loss_scale)?;
            self.scale = loss_scale;
        }
        match &mut self.graph {
            Graph::Off => run_package(self.loader, images, labels, &self.loss_scale),
            Graph::Warming { runs, .. } if *runs < WARMUP_RUNS => {
                *runs += 1;
                run_package(self.loader, images, labels, &self.loss_scale)
            }
            Graph::Warming { library, .. } => {
                let library = Arc::clone(library);
                self.capture(&library, images, labels)
            }
            Graph::Captured {
                graph,
                images: image_slot,
                labels: label_slot,
                loss,
                ..
            } => {
                image_slot.f_copy_(images)?;
                label_slot.f_copy_(labels)?;
                graph.replay()?;
                Ok(loss.shallow_clone())
            }
        }
    }

    /// The run (1-based) whose step was captured into a CUDA graph, which every later run
    /// replays; None while none was.
    pub fn captured_at(&self) -> Option<u64> {
        match self.graph {
            Graph::Captured { at, .. } => Some(at),
            _ => None,
        }
    }

    /// Captures the package's run on static copies of `images` and `labels` into a CUDA
    /// graph, then replays it once for this step.
    fn capture(
        &mut self,
        library: &Arc<GraphLibrary>,
        images: &Tensor,
        labels: &Tensor,
    ) -> Result<Tensor> {
        let gpu = self.gpu.expect("graphs are used on a GPU only");
        // empty_like keeps the batch's strides (channels-last included).
        let mut image_slot = images.f_empty_like()?;
        let mut label_slot = labels.f_empty_like()?;
        image_slot.f_copy_(images)?;
        label_slot.f_copy_(labels)?;
        let mut loss = None;
        let (loader, scale) = (self.loader, &self.loss_scale);
        let graph = library.capture(gpu, &mut || {
            loss = Some(run_package(loader, &image_slot, &label_slot, scale)?);
            Ok(())
        })?;
        let loss = loss.expect("the capture ran the package");
        graph.replay()?;
        let out = loss.shallow_clone();
        self.graph = Graph::Captured {
            graph,
            images: image_slot,
            labels: label_slot,
            loss,
            at: self.runs,
        };
        Ok(out)
    }
}

/// One run of the package `loader` on `images`, `labels` and `loss_scale`: the loss.
fn run_package(
    loader: *mut c_void,
    images: &Tensor,
    labels: &Tensor,
    loss_scale: &Tensor,
) -> Result<Tensor> {
    let ins = [raw(images), raw(labels), raw(loss_scale)];
    let mut outs = [std::ptr::null_mut(); 4];
    let mut count = 0;
    // SAFETY: a live loader and input tensors; `outs` has room for `capacity` new tensors.
    check(
        unsafe {
            ddl_aoti_run(
                loader,
                ins.as_ptr(),
                ins.len() as i64,
                outs.as_mut_ptr(),
                outs.len() as i64,
                &mut count,
            )
        },
        "running the compiled step",
    )?;
    // SAFETY: the first `count` entries are tensors allocated with `new`, owned from now on
    // (tch frees them with `delete`).
    let mut tensors: Vec<Tensor> = outs[..count as usize]
        .iter()
        .map(|&p| unsafe { Tensor::from_ptr(p as *mut torch_sys::C_tensor) })
        .collect();
    if tensors.len() != 1 {
        return Err(TrainError::Compile(format!(
            "the compiled step returned {} outputs, not the loss alone",
            tensors.len()
        )));
    }
    Ok(tensors.remove(0))
}

impl Drop for StepPackage {
    fn drop(&mut self) {
        // The graph launches the package's kernels: freed first.
        self.graph = Graph::Off;
        // SAFETY: created by `ddl_aoti_load`, freed once.
        unsafe { ddl_aoti_free(self.loader) }
    }
}
