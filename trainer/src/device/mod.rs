//! Devices: which local devices get a replica ([`DeviceSpec`], `devices`), and every place
//! where a replica on a GPU works differently from one on the CPU, each with a CPU half that
//! the CPU tests run:
//!
//! | what | CUDA | CPU |
//! |---|---|---|
//! | streams ([`DeviceCtx`]) | the thread's current stream computes, a side stream copies | one order: work is done when queued |
//! | [`Event`] | a CUDA event: streams wait for it on the device, threads on the host | already complete |
//! | host buffers ([`DeviceCtx::host_buffer`]) | pinned, so that copies run without the thread | plain memory |
//! | copies ([`DeviceCtx::copy`]) | `non_blocking` | synchronous |
//! | [`DeviceCtx::sync`] before a time is read | waits for the device | nothing to wait for |
//! | autocast ([`autocast`]) | bf16 or fp16 | f32 |
//! | loss scaling ([`DeviceCtx::loss_scaled`]) | fp16 | never |
//! | cuDNN ([`configure_backend`]) | benchmark, or deterministic algorithms | no cuDNN |

mod ffi;
pub(crate) mod precision;
pub(crate) mod spec;

use tch::{Device, Kind, Tensor};

use crate::error::Result;

pub use precision::Precision;
pub use spec::{DeviceSpec, DeviceSpecError};

/// A point in the work queued on a stream, which other streams and threads can wait for. On
/// the CPU work is complete when it is queued: the event is complete from the start.
#[derive(Debug)]
pub struct Event(Option<ffi::RawEvent>);

impl Event {
    /// An event that is already complete.
    pub fn done() -> Event {
        Event(None)
    }

    /// Blocks the calling thread until the work before the event is done.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(e) = &self.0 {
            e.synchronize()?;
        }
        Ok(())
    }
}

/// The device of one replica thread and its side stream for copies. Work on the thread's
/// current stream (the compute stream) and on the side stream runs concurrently unless
/// ordered by [`Event`]s.
#[derive(Debug)]
pub struct DeviceCtx {
    device: Device,
    /// The side stream of a CUDA device.
    copy_stream: Option<ffi::RawStream>,
}

impl DeviceCtx {
    /// The context of `device`; on a GPU this takes a side stream from libtorch's pool.
    pub fn new(device: Device) -> Result<DeviceCtx> {
        let copy_stream = match device {
            Device::Cuda(i) => Some(ffi::stream_from_pool(i)?),
            _ => None,
        };
        Ok(DeviceCtx {
            device,
            copy_stream,
        })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether the device is a GPU.
    pub fn is_cuda(&self) -> bool {
        self.device.is_cuda()
    }

    fn current_stream(&self) -> Result<Option<ffi::RawStream>> {
        Ok(match self.device {
            Device::Cuda(i) => Some(ffi::current_stream(i)?),
            _ => None,
        })
    }

    fn record_on(stream: Option<ffi::RawStream>) -> Result<Event> {
        match stream {
            Some(s) => {
                let e = ffi::RawEvent::new()?;
                e.record(&s)?;
                Ok(Event(Some(e)))
            }
            None => Ok(Event::done()),
        }
    }

    /// An event after the work queued so far on the compute stream.
    pub fn record(&self) -> Result<Event> {
        Self::record_on(self.current_stream()?)
    }

    /// An event after the work queued so far on the side stream.
    pub fn record_side(&self) -> Result<Event> {
        Self::record_on(self.copy_stream)
    }

    /// Work queued on the compute stream from now on waits for `event` (which may come from
    /// another device's stream).
    pub fn wait(&self, event: &Event) -> Result<()> {
        if let (Some(e), Some(s)) = (&event.0, self.current_stream()?) {
            e.block(&s)?;
        }
        Ok(())
    }

    /// Work queued on the side stream from now on waits for `event`.
    pub fn wait_side(&self, event: &Event) -> Result<()> {
        if let (Some(e), Some(s)) = (&event.0, &self.copy_stream) {
            e.block(s)?;
        }
        Ok(())
    }

    /// `dst.copy_(src)` on the compute stream, without waiting for it when one side is a
    /// pinned host buffer (a CPU copy is done when this returns).
    pub fn copy(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
        ffi::copy(dst, src, self.is_cuda(), None)?;
        Ok(())
    }

    /// `dst.copy_(src)` on the side stream, without waiting for it; returns the event after
    /// it. On the CPU the copy is done when this returns.
    pub fn copy_side(&self, dst: &mut Tensor, src: &Tensor) -> Result<Event> {
        ffi::copy(dst, src, self.is_cuda(), self.copy_stream.as_ref())?;
        self.record_side()
    }

    /// Zeroed host memory of `n` values of `kind` for copies to and from the device: pinned
    /// (page-locked) for a GPU, so that copies run while the thread goes on.
    pub fn host_buffer(&self, n: usize, kind: Kind) -> Result<Tensor> {
        let t = Tensor::f_zeros([n as i64], (kind, Device::Cpu))?;
        Ok(if self.is_cuda() {
            ffi::pin_memory(&t)?
        } else {
            t
        })
    }

    /// Waits until every operation queued on the device has finished (before reading a
    /// time that should include them).
    pub fn sync(&self) {
        if let Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
    }

    /// Whether the loss is scaled (fp16 on a GPU; autocast never runs fp16 on the CPU).
    pub fn loss_scaled(&self, precision: Precision) -> bool {
        self.is_cuda() && precision == Precision::Fp16
    }
}

/// cuDNN for `devices`: with `deterministic`, its deterministic algorithms (a resumed run is
/// then bitwise the uninterrupted one); otherwise benchmark mode, which times the algorithms
/// of each convolution shape once and keeps the fastest, as PyTorch's training scripts set
/// it. Nothing on the CPU.
pub fn configure_backend(devices: &[Device], deterministic: bool) {
    if devices.iter().any(|d| d.is_cuda()) {
        ffi::set_cudnn(!deterministic, deterministic);
    }
}

/// Runs `f` under CUDA autocast in `precision` on this thread when that applies: on a GPU, not
/// in fp32 (the CPU computes in f32).
pub fn autocast<T>(device: Device, precision: Precision, f: impl FnOnce() -> T) -> T {
    if !device.is_cuda() || precision == Precision::Fp32 {
        return f();
    }
    set_cuda_autocast_dtype(precision);
    in_autocast(f)
}

/// Runs `f` in a CUDA autocast region of this thread, through ddl's shim: tch's own `autocast`
/// calls libtorch's deprecated entry points, which print a warning on every call.
fn in_autocast<T>(f: impl FnOnce() -> T) -> T {
    /// Leaves the region, also when `f` panics.
    struct Exit(bool);
    impl Drop for Exit {
        fn drop(&mut self) {
            ffi::autocast_exit(self.0);
        }
    }
    let _exit = Exit(ffi::autocast_enter());
    f()
}

/// One backward pass from every `outputs[i]`, seeded with `grads[i]` (what
/// `torch.autograd.backward(outputs, grads)` does).
pub fn backward(outputs: &[&Tensor], grads: &[&Tensor]) -> Result<()> {
    ffi::backward(outputs, grads)?;
    Ok(())
}

/// Makes `grad` the `.grad` of `param`: backward then accumulates into it in place.
pub fn set_grad(param: &Tensor, grad: &Tensor) -> Result<()> {
    ffi::set_grad(param, grad)?;
    Ok(())
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
fn set_cuda_autocast_dtype(precision: Precision) -> i8 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autocast_dtype_binding_round_trips() {
        // Runs on the CPU too: the autocast state exists whether or not a GPU does.
        assert_eq!(
            set_cuda_autocast_dtype(Precision::Bf16),
            SCALAR_TYPE_BFLOAT16
        );
        assert_eq!(set_cuda_autocast_dtype(Precision::Fp16), SCALAR_TYPE_HALF);
    }

    #[test]
    fn autocast_is_enabled_inside_its_region_only() {
        // Runs on the CPU too: the CUDA autocast state is a thread-local flag either way.
        assert!(!ffi::autocast_enabled());
        assert!(in_autocast(|| in_autocast(ffi::autocast_enabled)));
        assert!(!ffi::autocast_enabled());
        assert!(!autocast(
            Device::Cpu,
            Precision::Bf16,
            ffi::autocast_enabled
        ));
    }

    #[test]
    fn cpu_half_copies_at_once_and_events_are_complete() {
        let ctx = DeviceCtx::new(Device::Cpu).unwrap();
        assert!(!autocast(
            ctx.device(),
            Precision::Bf16,
            ffi::autocast_enabled
        ));
        assert!(!ctx.loss_scaled(Precision::Fp16));
        let src = Tensor::arange(6, (Kind::Float, Device::Cpu));
        let mut host = ctx.host_buffer(6, Kind::Float).unwrap();
        assert!(!host.is_pinned(Device::Cpu));
        let done = ctx.copy_side(&mut host, &src).unwrap();
        // Done when queued: the event is complete and the values are there.
        done.synchronize().unwrap();
        assert!(host.equal(&src));
        let mut back = Tensor::zeros([6], (Kind::Float, Device::Cpu));
        ctx.wait(&ctx.record().unwrap()).unwrap();
        ctx.wait_side(&Event::done()).unwrap();
        ctx.copy(&mut back, &host).unwrap();
        assert!(back.equal(&src));
        ctx.sync();
    }

    #[test]
    fn copy_reports_libtorch_errors() {
        let ctx = DeviceCtx::new(Device::Cpu).unwrap();
        let mut dst = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        let src = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let e = ctx.copy(&mut dst, &src).unwrap_err().to_string();
        assert!(e.contains("must match the size"), "{e}");
    }

    #[test]
    fn backward_from_several_outputs_with_their_gradients() {
        let x = Tensor::from_slice(&[1f32, 2.0, 3.0]).set_requires_grad(true);
        let a = &x * 2.0;
        let b = &x * &x;
        let ga = Tensor::from_slice(&[1f32, 0.0, 1.0]);
        let gb = Tensor::from_slice(&[0.5f32, 0.5, 0.5]);
        backward(&[&a, &b], &[&ga, &gb]).unwrap();
        // d/dx (2x . ga + x^2 . gb) = 2 ga + 2 x gb
        let want = Tensor::from_slice(&[3f32, 2.0, 5.0]);
        assert!(x.grad().equal(&want), "{:?}", x.grad());
    }

    #[test]
    fn backward_accumulates_into_an_assigned_grad_view() {
        let flat = Tensor::zeros([5], (Kind::Float, Device::Cpu));
        let p = Tensor::from_slice(&[1f32, 2.0]).set_requires_grad(true);
        set_grad(&p, &flat.narrow(0, 2, 2)).unwrap();
        for _ in 0..2 {
            (&p * 3.0).sum(Kind::Float).backward();
        }
        // Both passes landed in the flat buffer, in place.
        let want = Tensor::from_slice(&[0f32, 0.0, 6.0, 6.0, 0.0]);
        assert!(flat.equal(&want), "{flat:?}");
    }
}
