// The few libtorch calls ddl needs that tch does not bind: CUDA streams and events (through
// c10's device-generic interfaces, so this compiles against a CPU-only libtorch too), copies
// with `non_blocking`, backward from several outputs with their gradients, assigning a
// parameter's `.grad`, and the cuDNN switches. Every function returns nullptr or an error
// message that the caller frees with `ddl_free_error` (guarded.h).

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include "guarded.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

namespace {

// A stream as plain data (c10::Stream::pack3).
struct Stream {
  int64_t id;
  int64_t device_index;
  int64_t device_type;
};

c10::Stream unpack(const Stream* s) {
  return c10::Stream::unpack3(s->id, static_cast<c10::DeviceIndex>(s->device_index),
                              static_cast<c10::DeviceType>(s->device_type));
}

void pack(const c10::Stream& s, Stream* out) {
  auto d = s.pack3();
  out->id = d.stream_id;
  out->device_index = d.device_index;
  out->device_type = static_cast<int64_t>(d.device_type);
}

using ddl::guarded;

}  // namespace

extern "C" {

void ddl_free_error(char* e) { free(e); }

// A stream of CUDA device `device` from libtorch's pool.
char* ddl_cuda_stream_from_pool(int64_t device, Stream* out) {
  return guarded([&] {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    auto d = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    pack(impl.getStreamFromGlobalPool(d, false), out);
  });
}

// The calling thread's current stream of CUDA device `device`.
char* ddl_cuda_current_stream(int64_t device, Stream* out) {
  return guarded([&] {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    pack(impl.getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))),
         out);
  });
}

// A new CUDA event (created on its first record).
char* ddl_cuda_event_new(void** out) {
  return guarded([&] { *out = new c10::Event(c10::DeviceType::CUDA); });
}

void ddl_event_free(void* event) { delete static_cast<c10::Event*>(event); }

char* ddl_event_record(void* event, const Stream* stream) {
  return guarded([&] { static_cast<c10::Event*>(event)->record(unpack(stream)); });
}

// Work queued on `stream` after this call waits for the event (a no-op before its first
// record).
char* ddl_event_block(void* event, const Stream* stream) {
  return guarded([&] { static_cast<c10::Event*>(event)->block(unpack(stream)); });
}

char* ddl_event_synchronize(void* event) {
  return guarded([&] { static_cast<c10::Event*>(event)->synchronize(); });
}

// `dst.copy_(src, non_blocking)`, queued on `stream` when it is not null.
char* ddl_copy(at::Tensor* dst, const at::Tensor* src, bool non_blocking, const Stream* stream) {
  return guarded([&] {
    if (stream) {
      c10::StreamGuard guard(unpack(stream));
      dst->copy_(*src, non_blocking);
    } else {
      dst->copy_(*src, non_blocking);
    }
  });
}

// torch::autograd::backward(outputs, grads): one backward pass from every output, each seeded
// with its gradient.
char* ddl_backward(at::Tensor* const* outputs, at::Tensor* const* grads, int64_t n) {
  return guarded([&] {
    std::vector<at::Tensor> outs, gs;
    for (int64_t i = 0; i < n; i++) {
      outs.push_back(*outputs[i]);
      gs.push_back(*grads[i]);
    }
    torch::autograd::backward(outs, gs);
  });
}

// A pinned (page-locked) copy of the CPU tensor `t`, for the default accelerator.
char* ddl_pin_memory(const at::Tensor* t, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(t->pin_memory()); });
}

// param.grad = grad (autograd then accumulates into it in place).
char* ddl_set_grad(at::Tensor* param, const at::Tensor* grad) {
  return guarded([&] { param->mutable_grad() = *grad; });
}

// Enables CUDA autocast on the calling thread (its state is thread-local) and returns whether it
// was enabled, for ddl_autocast_exit. These are libtorch's per-device calls: tch's `autocast`
// uses the deprecated device-less ones, which print a warning on every call.
bool ddl_autocast_enter() {
  bool was_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::increment_nesting();
  return was_enabled;
}

// Leaves the autocast region entered by ddl_autocast_enter (its cast cache freed with the
// outermost one).
void ddl_autocast_exit(bool was_enabled) {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(at::kCUDA, was_enabled);
}

bool ddl_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCUDA); }

void ddl_set_cudnn(bool benchmark, bool deterministic) {
  at::globalContext().setBenchmarkCuDNN(benchmark);
  at::globalContext().setDeterministicCuDNN(deterministic);
}

}  // extern "C"
