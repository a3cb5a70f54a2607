// The AOTInductor package of a compiled training step, through libtorch's own loader
// (torch::inductor::AOTIModelPackageLoader, exported by libtorch_cpu). Every function returns
// nullptr or an error message that the caller frees with `ddl_free_error` (guarded.h).

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "../device/guarded.h"

namespace {

using ddl::guarded;

// A package and the CUDA device it runs on (-1: the CPU).
struct Package {
  torch::inductor::AOTIModelPackageLoader loader;
  int64_t device_index;
};

}  // namespace

extern "C" {

// Loads the package at `path` for CUDA device `device_index` (-1: the CPU). Single-threaded
// (a package serves one replica's thread): a run then queues its kernels at once, where the
// threaded runner of one model first waits for the previous run to finish on the device, so
// that the host could never queue a step ahead of the GPU.
char* ddl_aoti_load(const char* path, int64_t device_index, void** out) {
  return guarded([&] {
    auto index = static_cast<c10::DeviceIndex>(device_index);
    *out = new Package{torch::inductor::AOTIModelPackageLoader(path, "model", true, 1, index),
                       device_index};
  });
}

void ddl_aoti_free(void* package) { delete static_cast<Package*>(package); }

// The names of the constants the package reads or writes, each followed by '\n', in a string
// the caller frees with `ddl_free_error`.
char* ddl_aoti_constant_names(void* package, char** out) {
  return guarded([&] {
    std::string all;
    for (const auto& name : static_cast<Package*>(package)->loader.get_constant_fqns()) {
      all += name;
      all += '\n';
    }
    *out = strdup(all.c_str());
  });
}

// Binds every constant of the package to the caller's tensor of that name, without a copy
// (user-managed: the package computes with whatever the tensors hold at each run and writes
// its in-place updates into them). Fails unless every constant gets one.
char* ddl_aoti_bind(void* package, const char* const* names, at::Tensor* const* tensors,
                    int64_t n) {
  return guarded([&] {
    std::unordered_map<std::string, at::Tensor> map;
    for (int64_t i = 0; i < n; i++) map.emplace(names[i], *tensors[i]);
    static_cast<Package*>(package)->loader.load_constants(map, false, true, true);
  });
}

// Runs the package on `inputs` (on a GPU: on its device, on the calling thread's current
// stream of that device); its outputs are written to `outputs` (at most `capacity`, as new
// tensors the caller owns) and their count to `count`.
char* ddl_aoti_run(void* package, at::Tensor* const* inputs, int64_t n, at::Tensor** outputs,
                   int64_t capacity, int64_t* count) {
  return guarded([&] {
    auto* p = static_cast<Package*>(package);
    std::vector<at::Tensor> in;
    in.reserve(n);
    for (int64_t i = 0; i < n; i++) in.push_back(*inputs[i]);
    std::vector<at::Tensor> out;
    if (p->device_index >= 0) {
      auto device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(p->device_index));
      c10::DeviceGuard guard(device);
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      out = p->loader.run(in, impl.getStream(device).native_handle());
    } else {
      out = p->loader.run(in);
    }
    if (static_cast<int64_t>(out.size()) > capacity)
      throw std::runtime_error("the package returned " + std::to_string(out.size()) +
                               " outputs, more than the " + std::to_string(capacity) +
                               " a training step has");
    for (size_t i = 0; i < out.size(); i++) outputs[i] = new at::Tensor(std::move(out[i]));
    *count = static_cast<int64_t>(out.size());
  });
}

}  // extern "C"
