//! Bindings of `shim.cpp`: the libtorch calls tch does not bind.

use std::ffi::{c_char, c_void, CStr};

use tch::{TchError, Tensor};

/// A stream as plain data (`c10::Stream::pack3`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RawStream {
    id: i64,
    device_index: i64,
    device_type: i64,
}

extern "C" {
    fn ddl_free_error(e: *mut c_char);
    fn ddl_cuda_stream_from_pool(device: i64, out: *mut RawStream) -> *mut c_char;
    fn ddl_cuda_current_stream(device: i64, out: *mut RawStream) -> *mut c_char;
    fn ddl_cuda_event_new(out: *mut *mut c_void) -> *mut c_char;
    fn ddl_event_free(event: *mut c_void);
    fn ddl_event_record(event: *mut c_void, stream: *const RawStream) -> *mut c_char;
    fn ddl_event_block(event: *mut c_void, stream: *const RawStream) -> *mut c_char;
    fn ddl_event_synchronize(event: *mut c_void) -> *mut c_char;
    fn ddl_copy(
        dst: *mut c_void,
        src: *const c_void,
        non_blocking: bool,
        stream: *const RawStream,
    ) -> *mut c_char;
    fn ddl_backward(outputs: *const *mut c_void, grads: *const *mut c_void, n: i64) -> *mut c_char;
    fn ddl_set_grad(param: *mut c_void, grad: *const c_void) -> *mut c_char;
    fn ddl_pin_memory(t: *const c_void, out: *mut *mut c_void) -> *mut c_char;
    fn ddl_set_cudnn(benchmark: bool, deterministic: bool);
    fn ddl_autocast_enter() -> bool;
    fn ddl_autocast_exit(was_enabled: bool);
    #[cfg(test)]
    fn ddl_autocast_enabled() -> bool;
}

/// The shim's error message, if any, as a `TchError` (and the message freed).
fn check(e: *mut c_char) -> Result<(), TchError> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string from strdup, freed once here.
    let message = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
    unsafe { ddl_free_error(e) };
    Err(TchError::Torch(message))
}

fn raw(t: &Tensor) -> *mut c_void {
    t.as_ptr() as *mut c_void
}

pub(super) fn stream_from_pool(device: usize) -> Result<RawStream, TchError> {
    let mut out = RawStream {
        id: 0,
        device_index: 0,
        device_type: 0,
    };
    // SAFETY: `out` is a valid destination.
    check(unsafe { ddl_cuda_stream_from_pool(device as i64, &mut out) })?;
    Ok(out)
}

pub(super) fn current_stream(device: usize) -> Result<RawStream, TchError> {
    let mut out = RawStream {
        id: 0,
        device_index: 0,
        device_type: 0,
    };
    // SAFETY: `out` is a valid destination.
    check(unsafe { ddl_cuda_current_stream(device as i64, &mut out) })?;
    Ok(out)
}

/// An owned `c10::Event` of the CUDA backend.
#[derive(Debug)]
pub(super) struct RawEvent(*mut c_void);

// SAFETY: a CUDA event may be recorded, waited for and destroyed from any thread.
unsafe impl Send for RawEvent {}
unsafe impl Sync for RawEvent {}

impl RawEvent {
    pub(super) fn new() -> Result<RawEvent, TchError> {
        let mut out = std::ptr::null_mut();
        // SAFETY: `out` is a valid destination.
        check(unsafe { ddl_cuda_event_new(&mut out) })?;
        Ok(RawEvent(out))
    }

    pub(super) fn record(&self, stream: &RawStream) -> Result<(), TchError> {
        // SAFETY: a live event and a stream packed by the shim.
        check(unsafe { ddl_event_record(self.0, stream) })
    }

    pub(super) fn block(&self, stream: &RawStream) -> Result<(), TchError> {
        // SAFETY: as above.
        check(unsafe { ddl_event_block(self.0, stream) })
    }

    pub(super) fn synchronize(&self) -> Result<(), TchError> {
        // SAFETY: a live event.
        check(unsafe { ddl_event_synchronize(self.0) })
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: created by `ddl_cuda_event_new`, freed once.
        unsafe { ddl_event_free(self.0) }
    }
}

/// `dst.copy_(src, non_blocking)`, on `stream` if given (else the current stream).
pub(super) fn copy(
    dst: &mut Tensor,
    src: &Tensor,
    non_blocking: bool,
    stream: Option<&RawStream>,
) -> Result<(), TchError> {
    let s = stream.map_or(std::ptr::null(), |s| s as *const RawStream);
    // SAFETY: live tensors; `s` is null or a packed stream.
    check(unsafe { ddl_copy(raw(dst), raw(src), non_blocking, s) })
}

/// One backward pass from every `outputs[i]`, seeded with `grads[i]`.
pub(super) fn backward(outputs: &[&Tensor], grads: &[&Tensor]) -> Result<(), TchError> {
    assert_eq!(outputs.len(), grads.len());
    let o: Vec<*mut c_void> = outputs.iter().map(|t| raw(t)).collect();
    let g: Vec<*mut c_void> = grads.iter().map(|t| raw(t)).collect();
    // SAFETY: two arrays of live tensors of the same length.
    check(unsafe { ddl_backward(o.as_ptr(), g.as_ptr(), o.len() as i64) })
}

/// A pinned copy of the CPU tensor `t` (`t.pin_memory()`, without tch's deprecated device
/// argument).
pub(super) fn pin_memory(t: &Tensor) -> Result<Tensor, TchError> {
    let mut out = std::ptr::null_mut();
    // SAFETY: a live tensor; on success `out` is a tensor allocated with `new`, which
    // `Tensor::from_ptr` takes over (tch frees it with `delete`).
    check(unsafe { ddl_pin_memory(raw(t), &mut out) })?;
    Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

/// `param.grad = grad`.
pub(super) fn set_grad(param: &Tensor, grad: &Tensor) -> Result<(), TchError> {
    // SAFETY: live tensors.
    check(unsafe { ddl_set_grad(raw(param), raw(grad)) })
}

/// cuDNN's algorithm search (`benchmark`) and its deterministic algorithms.
pub(super) fn set_cudnn(benchmark: bool, deterministic: bool) {
    // SAFETY: plain setters of libtorch's global context.
    unsafe { ddl_set_cudnn(benchmark, deterministic) }
}

/// Enables CUDA autocast on this thread; returns whether it was enabled.
pub(super) fn autocast_enter() -> bool {
    // SAFETY: touches only libtorch's thread-local autocast state.
    unsafe { ddl_autocast_enter() }
}

/// Leaves the region `autocast_enter` began, restoring `was_enabled`.
pub(super) fn autocast_exit(was_enabled: bool) {
    // SAFETY: as autocast_enter.
    unsafe { ddl_autocast_exit(was_enabled) }
}

/// Whether CUDA autocast is enabled on this thread.
#[cfg(test)]
pub(super) fn autocast_enabled() -> bool {
    // SAFETY: as autocast_enter.
    unsafe { ddl_autocast_enabled() }
}
