//! The data-parallel table: one OS thread and one model replica per local device.
//!
//! Every step each replica thread pulls its own batch, runs forward and backward, and copies
//! its gradients into a flat f32 buffer laid out in *reverse* parameter order and cut into
//! buckets. Bucket by bucket, the replicas sum their buffers along a fixed binomial tree over
//! the threads (replica r receives from r + 2^l at level l), replica 0 copies the node sum to
//! host memory and hands the bucket to the rank's communication thread (the caller of
//! [`Table::step`]), which allreduces it across ranks and scales it by 1 / (global replica
//! count). Each replica applies the update of bucket k as soon as it is reduced. Every replica
//! applies the same averaged gradient to the same weights, so replicas stay bitwise identical;
//! BatchNorm running statistics stay per replica.
//!
//! How much of this overlaps is [`Overlap`] (`--overlap`):
//!
//! - `off`: the whole gradient is one bucket, summed, copied and allreduced after backward.
//! - `pipeline`: buckets of about `--bucket-mb`; after backward, the communication thread
//!   allreduces bucket k while the replicas sum and copy bucket k+1.
//! - `backward`: the allreduce also overlaps backward. tch has no autograd hooks, so the
//!   replica runs the model as a chain of stages ([`crate::model::Network`]: stem, each
//!   residual block, head), cutting the graph between stages (the input of stage s is the
//!   detached output of stage s-1, marked as requiring grad). Backward runs the loss through
//!   the last stage, then for each earlier stage s backpropagates `sum(out_s * g)`, where g is
//!   the gradient that arrived at stage s+1's input, so gradients flow into the same
//!   operations as in one backward call. Buckets never span a stage boundary, and as soon as
//!   the backward of a stage is done every bucket whose parameters all lie in stages already
//!   done is summed, copied and handed to the communication thread, which allreduces it while
//!   the replica runs the backward of the earlier stages. The gradient arriving at a stage
//!   boundary is summed from the same two consumers (residual and main path, or one) as in a
//!   single backward call, and two-term sums commute, so on CPU the gradients, and hence the
//!   weights, are bitwise those of `off` and `pipeline` (a test checks it). On CUDA the
//!   device-to-host copy of a bucket is issued from the replica thread, between stages.
//!
//! The tree and the bucket order are fixed, so a run is deterministic on CPU in every mode.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use ddl_loader::pipeline::{Batch, Images, IMAGENET_MEAN, IMAGENET_STD};
use tch::nn;
use tch::{Device, Kind, Reduction, Tensor};

use crate::error::{Result, TrainError};
use crate::model::{self, ModelKind};
use crate::optim::{Sgd, SgdConfig};

/// A source of batches for one replica (the loader's per-replica queue).
pub type BatchIter = Box<dyn Iterator<Item = ddl_loader::Result<Batch>> + Send>;

/// How many leading images of an evaluation batch count (the rest is padding).
pub type ValidCount = Box<dyn Fn(&Batch) -> usize + Send>;

/// Arithmetic precision of forward and backward. Gradients are always reduced in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Everything in f32.
    Fp32,
    /// CUDA autocast to bfloat16 (on CPU: f32).
    Bf16,
    /// CUDA autocast to float16 with dynamic loss scaling (on CPU: f32).
    Fp16,
}

impl std::str::FromStr for Precision {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            _ => Err(TrainError::config(
                "--precision",
                format!("{s:?} is not fp32, bf16 or fp16"),
            )),
        }
    }
}

impl Precision {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
}

/// How the gradient reduction overlaps the replicas' work (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// One bucket, reduced after backward.
    Off,
    /// Buckets pipelined after backward (sum and copy of bucket k+1 while k is allreduced).
    Pipeline,
    /// Staged backward: a bucket is allreduced while the earlier stages are still in backward.
    Backward,
}

impl std::str::FromStr for Overlap {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Overlap::Off),
            "pipeline" => Ok(Overlap::Pipeline),
            "backward" => Ok(Overlap::Backward),
            _ => Err(TrainError::config(
                "--overlap",
                format!("{s:?} is not backward, pipeline, off or auto"),
            )),
        }
    }
}

impl Overlap {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Off => "off",
            Overlap::Pipeline => "pipeline",
            Overlap::Backward => "backward",
        }
    }
}

/// Configuration of the table of one rank.
#[derive(Clone, Debug)]
pub struct TableConfig {
    /// One replica per entry.
    pub devices: Vec<Device>,
    /// Network.
    pub model: ModelKind,
    /// Number of output classes.
    pub classes: i64,
    /// Square input size in pixels.
    pub image_size: u32,
    /// Seed of the weight initialisation (identical on every rank).
    pub seed: u64,
    /// Optimizer.
    pub sgd: SgdConfig,
    /// Forward/backward precision.
    pub precision: Precision,
    /// Label smoothing of the cross-entropy loss.
    pub label_smoothing: f64,
    /// Target bucket size in bytes.
    pub bucket_bytes: usize,
    /// What the gradient reduction overlaps with.
    pub overlap: Overlap,
    /// Channels-last images and convolution weights (activations follow).
    pub channels_last: bool,
    /// Total number of replicas over all ranks (the divisor of the gradient sum).
    pub global_replicas: usize,
}

/// One parameter of the model in the flat gradient buffer.
#[derive(Clone, Debug)]
pub struct ParamInfo {
    /// torchvision-style dotted name, e.g. `layer1.0.conv1.weight`.
    pub name: String,
    /// Shape.
    pub shape: Vec<i64>,
    /// Number of elements.
    pub numel: usize,
    /// Offset in the flat buffer (elements).
    pub offset: usize,
    /// Whether weight decay applies.
    pub decay: bool,
}

/// A contiguous range of the flat buffer holding whole parameters.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// First element.
    pub start: usize,
    /// Number of elements.
    pub len: usize,
    /// Indices (into [`Layout::params`]) of the parameters in the bucket.
    pub params: Vec<usize>,
    /// The model stage whose backward completes the bucket's gradients (0 when the layout is
    /// not staged).
    pub stage: usize,
}

/// Where every parameter and buffer lives in the flat representation.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Trainable parameters in creation (forward) order.
    pub params: Vec<ParamInfo>,
    /// Non-trainable buffers (BatchNorm running statistics), sorted by name: (name, shape).
    pub buffers: Vec<(String, Vec<i64>)>,
    /// Buckets in reduction order (the last layers first).
    pub buckets: Vec<Bucket>,
    /// Total parameter elements.
    pub total: usize,
}

impl Layout {
    /// Lays out the variables of `vs` in reverse creation order, cut into buckets of about
    /// `bucket_bytes` (a larger parameter gets a bucket of its own).
    pub fn new(vs: &nn::VarStore, bucket_bytes: usize) -> Layout {
        Self::staged(vs, bucket_bytes, &|_| 0)
    }

    /// As [`Layout::new`], and a bucket never holds parameters of two stages: `stage_of` maps
    /// a variable name to its model stage ([`crate::model::Network::stage_of`]).
    pub fn staged(
        vs: &nn::VarStore,
        bucket_bytes: usize,
        stage_of: &dyn Fn(&str) -> usize,
    ) -> Layout {
        let named = vs.variables();
        let by_ptr: HashMap<usize, &String> = named
            .iter()
            .map(|(n, t)| (t.data_ptr() as usize, n))
            .collect();
        let trainable = vs.trainable_variables();
        let mut params: Vec<ParamInfo> = trainable
            .iter()
            .map(|t| {
                let shape = t.size();
                let name = by_ptr
                    .get(&(t.data_ptr() as usize))
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                ParamInfo {
                    name,
                    numel: shape.iter().product::<i64>() as usize,
                    decay: crate::optim::decays(&shape),
                    shape,
                    offset: 0,
                }
            })
            .collect();
        let trainable_names: std::collections::HashSet<&str> =
            params.iter().map(|p| p.name.as_str()).collect();
        let mut buffers: Vec<(String, Vec<i64>)> = named
            .iter()
            .filter(|(n, _)| !trainable_names.contains(n.as_str()))
            .map(|(n, t)| (n.clone(), t.size()))
            .collect();
        buffers.sort();
        let cap = (bucket_bytes / 4).max(1);
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut offset = 0;
        for i in (0..params.len()).rev() {
            params[i].offset = offset;
            let n = params[i].numel;
            let stage = stage_of(&params[i].name);
            match buckets.last_mut() {
                Some(b) if b.len + n <= cap && b.stage == stage => {
                    b.len += n;
                    b.params.push(i);
                }
                _ => buckets.push(Bucket {
                    start: offset,
                    len: n,
                    params: vec![i],
                    stage,
                }),
            }
            offset += n;
        }
        Layout {
            params,
            buffers,
            buckets,
            total: offset,
        }
    }
}

/// Per-step measurements of one rank.
#[derive(Clone, Debug, Default)]
pub struct StepStats {
    /// Mean training loss over the rank's replicas (unscaled).
    pub loss: f64,
    /// Images processed by the rank.
    pub images: usize,
    /// Mean time replicas were blocked on their loader queue.
    pub data_wait: Duration,
    /// Mean forward + backward time.
    pub compute: Duration,
    /// Time the communication thread spent in allreduce calls.
    pub allreduce: Duration,
    /// Wall time of the step.
    pub wall: Duration,
    /// Whether the update was skipped (fp16 overflow).
    pub skipped: bool,
    /// Records the loader skipped as unreadable in these batches.
    pub bad_records: usize,
}

/// Sums of one evaluation pass of replica 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// Sum of the cross-entropy losses.
    pub loss: f64,
    /// Correct top-1 predictions.
    pub top1: f64,
    /// Correct top-5 predictions.
    pub top5: f64,
    /// Images evaluated.
    pub count: f64,
    /// Records left out as bad (never scored through a stand-in).
    pub skipped: f64,
}

/// Host copy of everything a replica holds, for checkpoints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaState {
    /// Parameters in [`Layout::params`] order.
    pub params: Vec<Vec<f32>>,
    /// Momentum buffers, same order.
    pub momentum: Vec<Vec<f32>>,
    /// BatchNorm buffers in [`Layout::buffers`] order.
    pub buffers: Vec<Vec<f32>>,
}

enum Cmd {
    Data(BatchIter),
    Step { lr: f64, seq: u64, loss_scale: f64 },
    Eval(BatchIter, ValidCount),
    GetState { full: bool },
    SetState(Box<ReplicaState>),
    Checksum,
    Stop,
}

enum Msg {
    Ready(usize),
    StepDone {
        loss: f64,
        images: usize,
        data_wait: Duration,
        compute: Duration,
        bad: usize,
    },
    Eval(EvalSums),
    State(Box<ReplicaState>),
    Checksum(u32),
    Failed(usize, TrainError),
}

/// Synchronisation shared by the replica threads and the communication thread.
struct Shared {
    /// Per replica: bucket sequence numbers whose subtree sum it has published.
    progress: Mutex<Vec<u64>>,
    progress_cv: Condvar,
    /// Bucket sequence numbers reduced across ranks, and whether the current step is skipped.
    reduced: Mutex<(u64, bool)>,
    reduced_cv: Condvar,
    /// Host copy of each bucket.
    host: Vec<RwLock<Vec<f32>>>,
    abort: AtomicBool,
}

impl Shared {
    fn aborted(&self, replica: usize) -> Result<()> {
        if self.abort.load(Ordering::SeqCst) {
            return Err(TrainError::Replica {
                replica,
                message: "aborted because another replica failed".into(),
            });
        }
        Ok(())
    }

    fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        let _p = self.progress.lock().map(|_| self.progress_cv.notify_all());
        let _r = self.reduced.lock().map(|_| self.reduced_cv.notify_all());
    }

    fn publish(&self, replica: usize, seq: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p[replica] = seq;
        self.progress_cv.notify_all();
    }

    fn wait_progress(&self, me: usize, replica: usize, seq: u64) -> Result<()> {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        while p[replica] < seq {
            self.aborted(me)?;
            p = self.progress_cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn publish_reduced(&self, seq: u64, skip: bool) {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        *r = (seq, skip);
        self.reduced_cv.notify_all();
    }

    fn wait_reduced(&self, me: usize, seq: u64) -> Result<bool> {
        let mut r = self.reduced.lock().unwrap_or_else(|e| e.into_inner());
        while r.0 < seq {
            self.aborted(me)?;
            r = self.reduced_cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        Ok(r.1)
    }
}

/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: i8 = 1;
/// `c10::ScalarType::Half`.
const SCALAR_TYPE_HALF: i8 = 5;
/// `c10::ScalarType::BFloat16`.
const SCALAR_TYPE_BFLOAT16: i8 = 15;

// libtorch's `at::autocast::{set,get}_autocast_dtype(c10::DeviceType, c10::ScalarType)`: tch
// exposes autocast on/off only (always float16 on CUDA). Both enums are `int8_t`-backed, so
// on the x86-64 and aarch64 C++ ABIs the calls take plain 8-bit integers.
extern "C" {
    #[link_name = "_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE"]
    fn at_set_autocast_dtype(device_type: i8, dtype: i8);
    #[link_name = "_ZN2at8autocast18get_autocast_dtypeEN3c1010DeviceTypeE"]
    fn at_get_autocast_dtype(device_type: i8) -> i8;
}

/// Sets the CUDA autocast dtype of the calling thread (autocast state is thread-local) for
/// `precision`; returns the dtype now in force as a `c10::ScalarType` code.
pub fn set_cuda_autocast_dtype(precision: Precision) -> i8 {
    let code = match precision {
        Precision::Bf16 => SCALAR_TYPE_BFLOAT16,
        Precision::Fp16 | Precision::Fp32 => SCALAR_TYPE_HALF,
    };
    // SAFETY: plain setters/getters of libtorch's thread-local autocast state; both arguments
    // are valid enum values.
    unsafe {
        at_set_autocast_dtype(DEVICE_TYPE_CUDA, code);
        at_get_autocast_dtype(DEVICE_TYPE_CUDA)
    }
}

fn sync_device(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Copies `src` (any device) into the host slice `dst`.
fn to_host(src: &Tensor, dst: &mut [f32]) -> Result<()> {
    // SAFETY: the blob views `dst`, which outlives it and is exclusively borrowed here.
    let mut blob = unsafe {
        Tensor::from_blob(
            dst.as_mut_ptr() as *const u8,
            &[dst.len() as i64],
            &[1],
            Kind::Float,
            Device::Cpu,
        )
    };
    blob.f_copy_(src)?;
    Ok(())
}

/// Copies the host slice `src`, the elements of `dst` in logical (row-major) order, into `dst`
/// (any device, any strides: channels-last weights too).
fn from_host(dst: &mut Tensor, src: &[f32]) -> Result<()> {
    let size = dst.size();
    if dst.numel() != src.len() {
        return Err(tch::TchError::Shape(format!(
            "{} host values for a tensor of shape {size:?}",
            src.len()
        ))
        .into());
    }
    // SAFETY: the blob views `src`, which outlives it, holds exactly the blob's elements (checked
    // above) and is only read.
    let blob = unsafe {
        Tensor::from_blob(
            src.as_ptr() as *const u8,
            &size,
            &[],
            Kind::Float,
            Device::Cpu,
        )
    };
    dst.f_copy_(&blob)?;
    Ok(())
}

/// `t` (4-D, NCHW) with channels-last strides: the same logical tensor, stored NHWC.
fn channels_last(t: &Tensor) -> Result<Tensor> {
    Ok(t.f_permute([0, 2, 3, 1])?
        .f_contiguous()?
        .f_permute([0, 3, 1, 2])?)
}

fn tensor_to_vec(t: &Tensor) -> Result<Vec<f32>> {
    let flat = t.f_detach()?.f_to_kind(Kind::Float)?.f_flatten(0, -1)?;
    let mut v = vec![0f32; flat.numel()];
    to_host(&flat, &mut v)?;
    Ok(v)
}

/// Converts a loader batch to (images NCHW f32, labels i64) on `device`, the images stored
/// channels-last when `nhwc`. The returned CPU tensors may alias the batch's buffers: keep the
/// batch alive while they are used.
fn batch_tensors(batch: &Batch, device: Device, nhwc: bool) -> Result<(Tensor, Tensor)> {
    let labels = Tensor::f_from_slice(&batch.labels)?.f_to_device(device)?;
    let images = images_tensor(&batch.images, batch.shape(), device, nhwc)?;
    Ok((images, labels))
}

/// The loader's `images` of `shape` (`[n, 3, h, w]` for f32, `[n, h, w, 3]` for u8) as a
/// normalized f32 NCHW tensor on `device`, stored channels-last when `nhwc`. On the CPU the
/// tensor may alias `images`.
fn images_tensor(images: &Images, shape: [usize; 4], device: Device, nhwc: bool) -> Result<Tensor> {
    let [n, a, b, c] = shape.map(|d| d as i64);
    let t = match images {
        Images::F32(v) => {
            // SAFETY: `v` outlives the returned tensor (the caller keeps the batch alive).
            let t = unsafe {
                Tensor::from_blob(
                    v.as_ptr() as *const u8,
                    &[n, a, b, c],
                    &[],
                    Kind::Float,
                    Device::Cpu,
                )
            };
            t.f_to_device(device)?
        }
        Images::U8(v) => {
            // SAFETY: as above.
            let t = unsafe {
                Tensor::from_blob(v.as_ptr(), &[n, a, b, c], &[], Kind::Uint8, Device::Cpu)
            };
            let mean = Tensor::f_from_slice(&IMAGENET_MEAN)?
                .f_view([1, 3, 1, 1])?
                .f_to_device(device)?;
            let std = Tensor::f_from_slice(&IMAGENET_STD)?
                .f_view([1, 3, 1, 1])?
                .f_to_device(device)?;
            t.f_to_device(device)?
                .f_permute([0, 3, 1, 2])?
                .f_to_kind(Kind::Float)?
                .f_div_scalar(255.0)?
                .f_sub(&mean)?
                .f_div(&std)?
        }
    };
    // A uint8 NHWC batch is channels-last after the permute already: no copy then.
    Ok(if nhwc {
        channels_last(&t)?
    } else {
        t.f_contiguous()?
    })
}

struct Replica {
    index: usize,
    device: Device,
    cfg: Arc<TableConfig>,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    _vs: nn::VarStore,
    model: model::Model,
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    sgd: Sgd,
    /// Flat gradient buffers of every replica (shallow handles), own one at `index`.
    flats: Vec<Tensor>,
    data: Option<BatchIter>,
    tx: Sender<Msg>,
}

impl Replica {
    fn run(mut self, rx: Receiver<Cmd>) {
        if self.device.is_cuda() {
            set_cuda_autocast_dtype(self.cfg.precision);
        }
        for cmd in rx {
            let out = match cmd {
                Cmd::Data(it) => {
                    self.data = Some(it);
                    Ok(None)
                }
                Cmd::Step {
                    lr,
                    seq,
                    loss_scale,
                } => self.step(lr, seq, loss_scale).map(Some),
                Cmd::Eval(it, valid) => self.eval(it, &valid).map(|s| Some(Msg::Eval(s))),
                Cmd::GetState { full } => self.state(full).map(|s| Some(Msg::State(Box::new(s)))),
                Cmd::SetState(s) => self.set_state(&s).map(|_| None),
                Cmd::Checksum => self.checksum().map(|c| Some(Msg::Checksum(c))),
                Cmd::Stop => break,
            };
            let msg = match out {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    self.shared.abort();
                    Msg::Failed(self.index, e)
                }
            };
            if self.tx.send(msg).is_err() {
                break;
            }
        }
    }

    fn step(&mut self, lr: f64, seq: u64, loss_scale: f64) -> Result<Msg> {
        let wait_start = Instant::now();
        let it = self.data.as_mut().ok_or_else(|| TrainError::Replica {
            replica: self.index,
            message: "step requested before any data source was attached".into(),
        })?;
        let batch = it.next().ok_or_else(|| TrainError::Replica {
            replica: self.index,
            message: "loader queue ended early".into(),
        })??;
        let data_wait = wait_start.elapsed();
        let replica = self.index as i64;
        ddl_trace::record(
            "data_wait",
            "train",
            wait_start,
            data_wait,
            &[("replica", replica)],
        );
        let compute_start = Instant::now();
        let (images, labels) = batch_tensors(&batch, self.device, self.cfg.channels_last)?;
        for p in self.params.iter_mut() {
            p.zero_grad();
        }
        let amp = self.cfg.precision != Precision::Fp32 && self.device.is_cuda();
        let staged = self.cfg.overlap == Overlap::Backward;
        let mut pass = tch::autocast(amp, || {
            model::StagedPass::forward(self.model.as_ref(), &images, true, staged)
        })?;
        let logits = pass.logits();
        let loss = logits
            .f_to_kind(Kind::Float)?
            .f_cross_entropy_loss::<Tensor>(
                &labels,
                None,
                Reduction::Mean,
                -100,
                self.cfg.label_smoothing,
            )?;
        let loss_value = loss.f_double_value(&[])?;
        let scaled = if loss_scale != 1.0 {
            loss.f_mul_scalar(loss_scale)?
        } else {
            loss
        };
        let stages = pass.stages();
        let backward_span = |s: usize| {
            ddl_trace::span_args(
                "backward",
                "train",
                &[("stage", s as i64), ("replica", replica)],
            )
        };
        {
            let _span = backward_span(stages - 1);
            scaled.f_backward()?;
        }
        drop(scaled);
        // Backward of the earlier stages, last first; after each, hand over the buckets it
        // completed.
        let mut handed = 0;
        let mut handing = Duration::ZERO;
        for s in (0..stages).rev() {
            if s + 1 < stages {
                let _span = backward_span(s);
                pass.backward_stage(s)?;
            }
            let ready = self.layout.buckets[handed..]
                .iter()
                .take_while(|b| b.stage >= s)
                .count();
            if ready > 0 {
                // A hand-off waits for the device anyway: count that wait as compute.
                sync_device(self.device);
                let t0 = Instant::now();
                for k in handed..handed + ready {
                    self.hand_off(k, seq)?;
                }
                handed += ready;
                handing += t0.elapsed();
            }
        }
        drop((pass, images));
        sync_device(self.device);
        let compute = compute_start.elapsed().saturating_sub(handing);
        ddl_trace::record(
            "forward_backward",
            "train",
            compute_start,
            compute_start.elapsed(),
            &[("replica", replica)],
        );
        let images_n = batch.len();
        let bad = batch.skipped;
        drop(batch);

        let _guard = tch::no_grad_guard();
        let k_count = self.layout.buckets.len() as u64;
        // Apply each bucket once it is reduced across ranks.
        let defer = self.cfg.precision == Precision::Fp16;
        for (k, bucket) in self.layout.buckets.iter().enumerate() {
            let wait_for = if defer {
                seq + k_count
            } else {
                seq + k as u64 + 1
            };
            let skip = {
                let _span = ddl_trace::span_args(
                    "wait_reduced",
                    "reduce",
                    &[("bucket", k as i64), ("replica", replica)],
                );
                self.shared.wait_reduced(self.index, wait_for)?
            };
            if skip {
                break;
            }
            let _span = ddl_trace::span_args(
                "sgd_update",
                "train",
                &[("bucket", k as i64), ("replica", replica)],
            );
            let mut flat =
                self.flats[self.index].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
            {
                let host = self.shared.host[k]
                    .read()
                    .unwrap_or_else(|e| e.into_inner());
                from_host(&mut flat, &host)?;
            }
            for &i in &bucket.params {
                let p = &self.layout.params[i];
                let mut g = flat
                    .f_narrow(0, (p.offset - bucket.start) as i64, p.numel as i64)?
                    .f_view(p.shape.as_slice())?;
                self.sgd.update(i, &mut self.params[i], &mut g, lr)?;
            }
        }
        sync_device(self.device);
        Ok(Msg::StepDone {
            loss: loss_value,
            images: images_n,
            data_wait,
            compute,
            bad,
        })
    }

    /// Copies the gradients of bucket `k` into this replica's flat buffer, sums it along the
    /// tree and, on replica 0, copies the node sum to host and hands it to the communication
    /// thread.
    fn hand_off(&self, k: usize, seq: u64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let bucket = &self.layout.buckets[k];
        let _span = ddl_trace::span_args(
            "intra_node_sum",
            "reduce",
            &[("bucket", k as i64), ("replica", self.index as i64)],
        );
        let q = seq + k as u64 + 1;
        let mut flat =
            self.flats[self.index].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
        for &i in &bucket.params {
            let p = &self.layout.params[i];
            let mut dst = flat.f_narrow(0, (p.offset - bucket.start) as i64, p.numel as i64)?;
            let g = self.params[i].grad();
            if g.defined() {
                dst.f_view(p.shape.as_slice())?.f_copy_(&g)?;
            } else {
                let _ = dst.f_zero_()?;
            }
        }
        let n = self.flats.len();
        let mut level = 1;
        while level < n {
            if self.index % (2 * level) != 0 {
                sync_device(self.device);
                self.shared.publish(self.index, q);
                return Ok(());
            }
            let partner = self.index + level;
            if partner < n {
                self.shared.wait_progress(self.index, partner, q)?;
                let theirs =
                    self.flats[partner].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
                let _ = flat.f_add_(&theirs.f_to_device(self.device)?)?;
            }
            level *= 2;
        }
        // Replica 0: the node sum of this bucket goes to the communication thread.
        let mut host = self.shared.host[k]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        to_host(&flat, &mut host)?;
        drop(host);
        self.tx
            .send(Msg::Ready(k))
            .map_err(|_| TrainError::Replica {
                replica: 0,
                message: "communication thread is gone".into(),
            })
    }

    fn eval(&mut self, it: BatchIter, valid: &ValidCount) -> Result<EvalSums> {
        let _guard = tch::no_grad_guard();
        let mut sums = EvalSums::default();
        let amp = self.cfg.precision != Precision::Fp32 && self.device.is_cuda();
        for batch in it {
            let batch = batch?;
            // The first `real` slots are this rank's records (the rest is padding); bad ones
            // among them were left out and the kept ones come first.
            let real = valid(&batch);
            let dropped = batch.dropped_among_first(real);
            sums.skipped += dropped as f64;
            let n = (real - dropped).min(batch.len()) as i64;
            if n == 0 {
                continue;
            }
            let (images, labels) = batch_tensors(&batch, self.device, self.cfg.channels_last)?;
            let (images, labels) = (images.f_narrow(0, 0, n)?, labels.f_narrow(0, 0, n)?);
            let logits = tch::autocast(amp, || self.model.forward_t(&images, false))
                .f_to_kind(Kind::Float)?;
            let loss =
                logits.f_cross_entropy_loss::<Tensor>(&labels, None, Reduction::Sum, -100, 0.0)?;
            let k = self.cfg.classes.min(5);
            let (_, top) = logits.f_topk(k, -1, true, true)?;
            let hits = top.f_eq_tensor(&labels.f_unsqueeze(1)?)?;
            sums.loss += loss.f_double_value(&[])?;
            sums.top1 += hits
                .f_narrow(1, 0, 1)?
                .f_sum(Kind::Float)?
                .f_double_value(&[])?;
            sums.top5 += hits.f_sum(Kind::Float)?.f_double_value(&[])?;
            sums.count += n as f64;
        }
        Ok(sums)
    }

    fn state(&self, full: bool) -> Result<ReplicaState> {
        let _guard = tch::no_grad_guard();
        let all = |ts: &[Tensor]| -> Result<Vec<Vec<f32>>> {
            if full {
                ts.iter().map(tensor_to_vec).collect()
            } else {
                Ok(Vec::new())
            }
        };
        Ok(ReplicaState {
            params: all(&self.params)?,
            momentum: all(self.sgd.momentum())?,
            buffers: self
                .buffers
                .iter()
                .map(tensor_to_vec)
                .collect::<Result<_>>()?,
        })
    }

    fn set_state(&mut self, s: &ReplicaState) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let check = |what: &str, got: usize, want: usize| {
            if got != want {
                Err(TrainError::Replica {
                    replica: self.index,
                    message: format!("state has {got} {what}, model has {want}"),
                })
            } else {
                Ok(())
            }
        };
        check("parameters", s.params.len(), self.params.len())?;
        check("momentum buffers", s.momentum.len(), self.params.len())?;
        check("buffers", s.buffers.len(), self.buffers.len())?;
        let momentum: Vec<Tensor> = self
            .sgd
            .momentum()
            .iter()
            .map(|t| t.shallow_clone())
            .collect();
        for (t, v) in self
            .params
            .iter()
            .chain(momentum.iter())
            .chain(self.buffers.iter())
            .zip(
                s.params
                    .iter()
                    .chain(s.momentum.iter())
                    .chain(s.buffers.iter()),
            )
        {
            if t.numel() != v.len() {
                return Err(TrainError::Replica {
                    replica: self.index,
                    message: format!(
                        "state tensor of {} elements for a tensor of {}",
                        v.len(),
                        t.numel()
                    ),
                });
            }
            from_host(&mut t.shallow_clone(), v)?;
        }
        sync_device(self.device);
        Ok(())
    }

    fn checksum(&self) -> Result<u32> {
        let mut crc = 0u32;
        for p in &self.params {
            let v = tensor_to_vec(p)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            crc = crc32c::crc32c_append(crc, &bytes);
        }
        Ok(crc)
    }
}

/// The replicas of one rank and the machinery that keeps them in step.
pub struct Table {
    cfg: Arc<TableConfig>,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    cmds: Vec<Sender<Cmd>>,
    msgs: Receiver<Msg>,
    handles: Vec<JoinHandle<()>>,
    seq: u64,
    loss_scale: f64,
    good_steps: u64,
}

/// Serialises seeding + initialisation (see [`Table::new`]).
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Initial fp16 loss scale.
const INITIAL_LOSS_SCALE: f64 = 65536.0;
/// Steps without overflow after which the fp16 loss scale doubles.
const SCALE_GROWTH_INTERVAL: u64 = 2000;

impl Table {
    /// Builds the replicas: the model is initialised once on the CPU from `cfg.seed` (so every
    /// rank starts from the same weights), then copied to every device.
    pub fn new(cfg: TableConfig) -> Result<Table> {
        if cfg.devices.is_empty() {
            return Err(TrainError::config("--devices", "no device given"));
        }
        if cfg.devices.iter().all(|d| *d == Device::Cpu) {
            // Each replica thread is one core's worth of work.
            tch::set_num_threads(1);
        }
        // The torch generator is global to the process: hold a lock while seeding and drawing
        // the initial weights, so that tables built concurrently (ranks simulated by threads)
        // all get the weights of `cfg.seed`.
        let init_guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(cfg.seed as i64);
        let reference = nn::VarStore::new(Device::Cpu);
        let model = model::build(cfg.model, &reference.root(), cfg.classes, cfg.image_size);
        drop(init_guard);
        let layout = Arc::new(match cfg.overlap {
            Overlap::Off => Layout::new(&reference, usize::MAX),
            Overlap::Pipeline => Layout::new(&reference, cfg.bucket_bytes),
            Overlap::Backward => {
                Layout::staged(&reference, cfg.bucket_bytes, &|name| model.stage_of(name))
            }
        });
        let init: Vec<(String, Vec<f32>)> = {
            let vars = reference.variables();
            let mut v: Vec<_> = vars
                .iter()
                .map(|(n, t)| Ok((n.clone(), tensor_to_vec(t)?)))
                .collect::<Result<_>>()?;
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let init = Arc::new(init);
        let n = cfg.devices.len();
        let shared = Arc::new(Shared {
            progress: Mutex::new(vec![0; n]),
            progress_cv: Condvar::new(),
            reduced: Mutex::new((0, false)),
            reduced_cv: Condvar::new(),
            host: layout
                .buckets
                .iter()
                .map(|b| RwLock::new(vec![0f32; b.len]))
                .collect(),
            abort: AtomicBool::new(false),
        });
        let cfg = Arc::new(cfg);
        // Flat gradient buffers, created here so that every thread gets handles to all of them.
        let mut flats: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::new()).collect();
        for d in cfg.devices.iter() {
            let t = Tensor::f_zeros([layout.total as i64], (Kind::Float, *d))?;
            for f in flats.iter_mut() {
                f.push(t.shallow_clone());
            }
        }
        let (msg_tx, msgs) = unbounded();
        let mut cmds = Vec::new();
        let mut handles = Vec::new();
        let (built_tx, built_rx) = unbounded::<Result<()>>();
        for (index, flats) in flats.into_iter().enumerate() {
            let (tx, rx) = unbounded();
            cmds.push(tx);
            let (cfg, layout, shared, init, msg_tx, built_tx) = (
                cfg.clone(),
                layout.clone(),
                shared.clone(),
                init.clone(),
                msg_tx.clone(),
                built_tx.clone(),
            );
            let handle = std::thread::Builder::new()
                .name(format!("replica-{index}"))
                .spawn(move || {
                    ddl_trace::set_thread_name(format!("replica {index}"));
                    let device = cfg.devices[index];
                    let replica = Self::build_replica(
                        index, device, cfg, layout, shared, &init, flats, msg_tx,
                    );
                    match replica {
                        Ok(r) => {
                            let _ = built_tx.send(Ok(()));
                            r.run(rx)
                        }
                        Err(e) => {
                            let _ = built_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|e| TrainError::Replica {
                    replica: index,
                    message: format!("cannot spawn thread: {e}"),
                })?;
            handles.push(handle);
        }
        let mut table = Table {
            cfg,
            layout,
            shared,
            cmds,
            msgs,
            handles,
            seq: 0,
            loss_scale: 1.0,
            good_steps: 0,
        };
        if table.cfg.precision == Precision::Fp16 {
            table.loss_scale = INITIAL_LOSS_SCALE;
        }
        for _ in 0..n {
            built_rx.recv().map_err(|_| TrainError::Replica {
                replica: 0,
                message: "replica thread died".into(),
            })??;
        }
        Ok(table)
    }

    #[allow(clippy::too_many_arguments)]
    fn build_replica(
        index: usize,
        device: Device,
        cfg: Arc<TableConfig>,
        layout: Arc<Layout>,
        shared: Arc<Shared>,
        init: &[(String, Vec<f32>)],
        flats: Vec<Tensor>,
        tx: Sender<Msg>,
    ) -> Result<Replica> {
        let vs = nn::VarStore::new(device);
        // Drawing this replica's (overwritten) initial values uses the global generator too.
        let init_guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let model = model::build(cfg.model, &vs.root(), cfg.classes, cfg.image_size);
        drop(init_guard);
        let vars = vs.variables();
        {
            let _guard = tch::no_grad_guard();
            for (name, values) in init {
                let t = vars.get(name).ok_or_else(|| TrainError::Replica {
                    replica: index,
                    message: format!("variable {name} missing in replica"),
                })?;
                from_host(&mut t.shallow_clone(), values)?;
            }
            if cfg.channels_last {
                for t in vars.values().filter(|t| t.dim() == 4) {
                    t.shallow_clone().f_set_data(&channels_last(t)?)?;
                }
            }
        }
        let get = |name: &str| {
            vars.get(name)
                .map(|t| t.shallow_clone())
                .ok_or_else(|| TrainError::Replica {
                    replica: index,
                    message: format!("variable {name} missing in replica"),
                })
        };
        let params = layout
            .params
            .iter()
            .map(|p| get(&p.name))
            .collect::<Result<Vec<_>>>()?;
        let buffers = layout
            .buffers
            .iter()
            .map(|(n, _)| get(n))
            .collect::<Result<Vec<_>>>()?;
        let shapes: Vec<Vec<i64>> = layout.params.iter().map(|p| p.shape.clone()).collect();
        let sgd = Sgd::new(cfg.sgd, &shapes, device)?;
        Ok(Replica {
            index,
            device,
            cfg,
            layout,
            shared,
            _vs: vs,
            model,
            params,
            buffers,
            sgd,
            flats,
            data: None,
            tx,
        })
    }

    /// The flat layout of parameters, buffers and buckets.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of local replicas.
    pub fn replicas(&self) -> usize {
        self.cmds.len()
    }

    /// Current fp16 loss scale and the count of steps since the last overflow.
    pub fn loss_scale(&self) -> (f64, u64) {
        (self.loss_scale, self.good_steps)
    }

    /// Restores the fp16 loss-scaler state.
    pub fn set_loss_scale(&mut self, scale: f64, good_steps: u64) {
        self.loss_scale = scale;
        self.good_steps = good_steps;
    }

    fn send(&self, replica: usize, cmd: Cmd) -> Result<()> {
        self.cmds[replica]
            .send(cmd)
            .map_err(|_| TrainError::Replica {
                replica,
                message: "replica thread has exited".into(),
            })
    }

    fn recv(&self) -> Result<Msg> {
        match self.msgs.recv() {
            Ok(Msg::Failed(replica, e)) => {
                self.shared.abort();
                Err(match e {
                    TrainError::Replica { .. } => e,
                    other => TrainError::Replica {
                        replica,
                        message: other.to_string(),
                    },
                })
            }
            Ok(m) => Ok(m),
            Err(_) => Err(TrainError::Replica {
                replica: 0,
                message: "all replica threads exited".into(),
            }),
        }
    }

    /// Attaches a batch source to each replica (one per replica, e.g. the loader's per-replica
    /// queues of an epoch).
    pub fn attach(&self, sources: Vec<BatchIter>) -> Result<()> {
        if sources.len() != self.replicas() {
            return Err(TrainError::Replica {
                replica: 0,
                message: format!(
                    "{} batch sources for {} replicas",
                    sources.len(),
                    self.replicas()
                ),
            });
        }
        for (r, s) in sources.into_iter().enumerate() {
            self.send(r, Cmd::Data(s))?;
        }
        Ok(())
    }

    /// Runs one synchronous step with learning rate `lr`. `allreduce` sums a bucket across
    /// ranks in place (a no-op for a single rank); it is called from this thread, bucket by
    /// bucket, in a fixed order.
    pub fn step(
        &mut self,
        lr: f64,
        allreduce: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<StepStats> {
        let start = Instant::now();
        let seq = self.seq;
        let k_count = self.layout.buckets.len() as u64;
        self.seq += k_count;
        for r in 0..self.replicas() {
            self.send(
                r,
                Cmd::Step {
                    lr,
                    seq,
                    loss_scale: self.loss_scale,
                },
            )?;
        }
        let inv = 1.0 / (self.cfg.global_replicas as f64 * self.loss_scale);
        let fp16 = self.cfg.precision == Precision::Fp16;
        let mut stats = StepStats::default();
        let mut done = 0;
        let mut next_bucket = 0usize;
        let mut finite = true;
        let mut allreduce_time = Duration::ZERO;
        while done < self.replicas() {
            match self.recv()? {
                Msg::Ready(k) => {
                    debug_assert_eq!(k, next_bucket);
                    next_bucket += 1;
                    {
                        let mut host = self.shared.host[k]
                            .write()
                            .unwrap_or_else(|e| e.into_inner());
                        let t0 = Instant::now();
                        if let Err(e) = allreduce(&mut host) {
                            self.shared.abort();
                            return Err(e);
                        }
                        let took = t0.elapsed();
                        allreduce_time += took;
                        ddl_trace::record(
                            "allreduce",
                            "comm",
                            t0,
                            took,
                            &[("bucket", k as i64), ("floats", host.len() as i64)],
                        );
                        let inv = inv as f32;
                        for x in host.iter_mut() {
                            *x *= inv;
                        }
                        if fp16 {
                            finite &= host.iter().all(|x| x.is_finite());
                        }
                    }
                    if !fp16 {
                        self.shared.publish_reduced(seq + k as u64 + 1, false);
                    } else if next_bucket as u64 == k_count {
                        self.shared.publish_reduced(seq + k_count, !finite);
                    }
                }
                Msg::StepDone {
                    loss,
                    images,
                    data_wait,
                    compute,
                    bad,
                } => {
                    done += 1;
                    stats.loss += loss;
                    stats.images += images;
                    stats.data_wait += data_wait;
                    stats.compute += compute;
                    stats.bad_records += bad;
                }
                _ => {
                    return Err(TrainError::Replica {
                        replica: 0,
                        message: "unexpected message during a step".into(),
                    })
                }
            }
        }
        let n = self.replicas() as u32;
        stats.loss /= f64::from(n);
        stats.data_wait /= n;
        stats.compute /= n;
        stats.allreduce = allreduce_time;
        stats.skipped = !finite;
        if fp16 {
            if finite {
                self.good_steps += 1;
                if self.good_steps >= SCALE_GROWTH_INTERVAL {
                    self.loss_scale *= 2.0;
                    self.good_steps = 0;
                }
            } else {
                self.loss_scale = (self.loss_scale / 2.0).max(1.0);
                self.good_steps = 0;
            }
        }
        stats.wall = start.elapsed();
        Ok(stats)
    }

    /// Evaluates replica 0 on `batches`, counting only the first `valid(batch)` images of each
    /// (padding is left out), and returns the sums (not yet reduced across ranks).
    pub fn evaluate(&self, batches: BatchIter, valid: ValidCount) -> Result<EvalSums> {
        self.send(0, Cmd::Eval(batches, valid))?;
        match self.recv()? {
            Msg::Eval(s) => Ok(s),
            _ => Err(TrainError::Replica {
                replica: 0,
                message: "unexpected reply to eval".into(),
            }),
        }
    }

    /// Host copies of every replica's state, in replica order. Parameters and momentum are
    /// identical on every replica, so only replica 0's are copied (`params` and `momentum`
    /// are empty for the others).
    pub fn states(&self) -> Result<Vec<ReplicaState>> {
        let mut out = Vec::new();
        for r in 0..self.replicas() {
            self.send(r, Cmd::GetState { full: r == 0 })?;
            match self.recv()? {
                Msg::State(s) => out.push(*s),
                _ => {
                    return Err(TrainError::Replica {
                        replica: r,
                        message: "unexpected reply to state".into(),
                    })
                }
            }
        }
        Ok(out)
    }

    /// Loads a state into replica `replica`.
    pub fn set_state(&self, replica: usize, state: ReplicaState) -> Result<()> {
        self.send(replica, Cmd::SetState(Box::new(state)))?;
        // Make sure it was applied (or surface its error) before returning.
        self.send(replica, Cmd::Checksum)?;
        match self.recv()? {
            Msg::Checksum(_) => Ok(()),
            _ => Err(TrainError::Replica {
                replica,
                message: "unexpected reply to set_state".into(),
            }),
        }
    }

    /// crc32c of every replica's parameters, in replica order.
    pub fn checksums(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for r in 0..self.replicas() {
            self.send(r, Cmd::Checksum)?;
            match self.recv()? {
                Msg::Checksum(c) => out.push(c),
                _ => {
                    return Err(TrainError::Replica {
                        replica: r,
                        message: "unexpected reply to checksum".into(),
                    })
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        self.shared.abort();
        for tx in &self.cmds {
            let _ = tx.send(Cmd::Stop);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NHWC strides of an NCHW shape.
    fn nhwc_strides(t: &Tensor) -> Vec<i64> {
        let s = t.size();
        vec![s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]]
    }

    #[test]
    fn channels_last_keeps_values_and_changes_strides() {
        let t = Tensor::arange(2 * 3 * 4 * 5, (Kind::Float, Device::Cpu)).view([2, 3, 4, 5]);
        let cl = channels_last(&t).unwrap();
        assert_eq!(cl.stride(), nhwc_strides(&t));
        assert!(cl.equal(&t));
        // from_host writes logical order into any strides; tensor_to_vec reads it back.
        let values: Vec<f32> = (0..120).map(|i| i as f32 * 0.5).collect();
        let mut dst =
            channels_last(&Tensor::zeros([2, 3, 4, 5], (Kind::Float, Device::Cpu))).unwrap();
        from_host(&mut dst, &values).unwrap();
        assert_eq!(dst.stride(), nhwc_strides(&t));
        assert_eq!(tensor_to_vec(&dst).unwrap(), values);
        assert!(from_host(&mut dst, &values[1..]).is_err());
    }

    #[test]
    fn images_tensor_layouts_agree() {
        let (n, h, w) = (2usize, 3usize, 4usize);
        let u8s: Vec<u8> = (0..n * h * w * 3).map(|i| (i * 7 % 256) as u8).collect();
        let u8_images = Images::U8(u8s.clone());
        let nchw = images_tensor(&u8_images, [n, h, w, 3], Device::Cpu, false).unwrap();
        let nhwc = images_tensor(&u8_images, [n, h, w, 3], Device::Cpu, true).unwrap();
        assert_eq!(nchw.size(), [2, 3, 3, 4]);
        assert!(nchw.is_contiguous());
        assert_eq!(nhwc.stride(), nhwc_strides(&nchw));
        assert!(nhwc.equal(&nchw));
        // Pixel (image 1, row 2, column 3), channel 1, normalized as the loader's f32 output.
        let raw = u8s[((n - 1) * h * w + 2 * w + 3) * 3 + 1] as f64;
        let want = (raw / 255.0 - IMAGENET_MEAN[1] as f64) / IMAGENET_STD[1] as f64;
        let got = nhwc.double_value(&[1, 1, 2, 3]);
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        let f32s: Vec<f32> = (0..n * 3 * h * w).map(|i| i as f32).collect();
        let f32_images = Images::F32(f32s);
        let a = images_tensor(&f32_images, [n, 3, h, w], Device::Cpu, false).unwrap();
        let b = images_tensor(&f32_images, [n, 3, h, w], Device::Cpu, true).unwrap();
        assert_eq!(b.stride(), nhwc_strides(&a));
        assert!(a.equal(&b));
    }

    #[test]
    fn autocast_dtype_binding_round_trips() {
        // Runs on the CPU too: the autocast state exists whether or not a GPU does.
        assert_eq!(
            set_cuda_autocast_dtype(Precision::Bf16),
            SCALAR_TYPE_BFLOAT16
        );
        assert_eq!(set_cuda_autocast_dtype(Precision::Fp16), SCALAR_TYPE_HALF);
    }
}
