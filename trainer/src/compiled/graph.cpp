// CUDA graphs over the compiled step (`--cuda-graphs`): the package's run captured once, then
// replayed, one launch for the step's few hundred kernels. step.py compiles this file on the
// machine the step is for, against its torch's and CUDA's headers, into graph.so in the cache
// entry; ddl-train opens it with dlopen, its undefined symbols resolving to the libtorch_cuda
// and CUDA runtime the process already runs on. Every function returns nullptr or an error
// message that the caller frees with `ddl_graph_free_error` (guarded.h).

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "guarded.h"

namespace {

// A captured graph and the device it runs on.
struct Graph {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device;
};

// One capture at a time in the process: a capture begins with a device-wide synchronization,
// which another replica's capture in progress would not allow.
std::mutex capturing;

}  // namespace

extern "C" {

void ddl_graph_free_error(char* e) { free(e); }

// Captures into a new graph what `run(ctx)` queues on CUDA device `device`, which must not
// depend on the host (no synchronization, no value read back). It runs on a side stream, as
// capture requires, from an idle device; what it allocates comes from the graph's private
// memory pool and keeps its address for every replay. `run` returns nullptr or an error
// message (freed here), which fails the capture.
char* ddl_graph_capture(int64_t device, char* (*run)(void*), void* ctx, void** out) {
  return ddl::guarded([&] {
    std::lock_guard<std::mutex> one_at_a_time(capturing);
    auto index = static_cast<c10::DeviceIndex>(device);
    c10::cuda::CUDAGuard device_guard(index);
    // From an idle device: the replica's earlier steps have finished before capture begins.
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    auto graph = std::make_unique<Graph>();
    graph->device = index;
    {
      c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, index));
      // Relaxed: the loader's threads and other replicas keep allocating and copying meanwhile.
      graph->graph.capture_begin({0, 0}, cudaStreamCaptureModeRelaxed);
      char* failed = run(ctx);
      if (failed) {
        std::string why(failed);
        free(failed);
        try {
          graph->graph.capture_end();
        } catch (...) {
        }
        throw std::runtime_error(why);
      }
      graph->graph.capture_end();
    }
    *out = graph.release();
  });
}

// Replays `graph` on the calling thread's current stream of its device.
char* ddl_graph_replay(void* graph) {
  return ddl::guarded([&] {
    auto* g = static_cast<Graph*>(graph);
    c10::cuda::CUDAGuard device_guard(g->device);
    g->graph.replay();
  });
}

void ddl_graph_free(void* graph) { delete static_cast<Graph*>(graph); }

}  // extern "C"
