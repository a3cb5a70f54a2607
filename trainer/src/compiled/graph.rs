//! CUDA graphs over the compiled step (`cuda_graphs`): the package's run captured once into a
//! graph and replayed at every later step, one launch where the package launches a few hundred
//! kernels. Capture and replay are libtorch_cuda's (`at::cuda::CUDAGraph`, whose private memory
//! pool keeps every buffer of the step at one address), reached through the entry's
//! `graph.so`: the compile script builds it from graph.cpp on the machine the step is for,
//! against that torch's and CUDA's headers, which ddl's own build does not need.

use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use crate::error::{Result, TrainError};

type Run = unsafe extern "C" fn(*mut c_void) -> *mut c_char;
type Capture = unsafe extern "C" fn(i64, Run, *mut c_void, *mut *mut c_void) -> *mut c_char;
type Replay = unsafe extern "C" fn(*mut c_void) -> *mut c_char;
type Free = unsafe extern "C" fn(*mut c_void);
type FreeError = unsafe extern "C" fn(*mut c_char);

/// An opened `graph.so`. It stays loaded for the life of the process.
pub struct GraphLibrary {
    capture: Capture,
    replay: Replay,
    free: Free,
    free_error: FreeError,
}

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for GraphLibrary {}
unsafe impl Sync for GraphLibrary {}

impl GraphLibrary {
    /// Opens the library at `path`; its undefined symbols must resolve to the libtorch_cuda
    /// and CUDA runtime this process runs on.
    pub fn open(path: &Path) -> Result<Arc<GraphLibrary>> {
        let fail = |why: String| {
            TrainError::Compile(format!("the CUDA graph library {}: {why}", path.display()))
        };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| fail("a NUL in the path".into()))?;
        // SAFETY: a NUL-terminated path; dlerror's message is copied at once.
        unsafe {
            let lib = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if lib.is_null() {
                let e = libc::dlerror();
                let why = if e.is_null() {
                    "dlopen failed".into()
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                };
                return Err(fail(why));
            }
            let symbol = |name: &CStr| {
                let f = libc::dlsym(lib, name.as_ptr());
                if f.is_null() {
                    Err(fail(format!("no symbol {}", name.to_string_lossy())))
                } else {
                    Ok(f)
                }
            };
            Ok(Arc::new(GraphLibrary {
                capture: std::mem::transmute::<*mut c_void, Capture>(symbol(c"ddl_graph_capture")?),
                replay: std::mem::transmute::<*mut c_void, Replay>(symbol(c"ddl_graph_replay")?),
                free: std::mem::transmute::<*mut c_void, Free>(symbol(c"ddl_graph_free")?),
                free_error: std::mem::transmute::<*mut c_void, FreeError>(symbol(
                    c"ddl_graph_free_error",
                )?),
            }))
        }
    }

    /// The library's message, if any (and frees it).
    fn check(&self, e: *mut c_char, what: &str) -> Result<()> {
        if e.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null return is a NUL-terminated string from strdup, freed once here.
        let message = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
        unsafe { (self.free_error)(e) };
        Err(TrainError::Compile(format!("{what}: {message}")))
    }

    /// Captures what `run` queues on CUDA device `device` (nothing in it may wait for the
    /// device or read a value back) into a graph.
    pub fn capture(
        self: &Arc<Self>,
        device: usize,
        run: &mut dyn FnMut() -> Result<()>,
    ) -> Result<CudaGraph> {
        let mut ctx = Captured { run, error: None };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `ctx` outlives the call, which calls `trampoline` with it on this thread.
        let e = unsafe {
            (self.capture)(
                device as i64,
                trampoline,
                &mut ctx as *mut Captured as *mut c_void,
                &mut raw,
            )
        };
        if let Some(error) = ctx.error {
            self.check(e, "").ok();
            return Err(error);
        }
        self.check(e, "capturing the compiled step in a CUDA graph")?;
        Ok(CudaGraph {
            library: Arc::clone(self),
            raw,
        })
    }
}

/// The closure a capture runs, and its error.
struct Captured<'a> {
    run: &'a mut dyn FnMut() -> Result<()>,
    error: Option<TrainError>,
}

/// Runs the capture's closure for graph.cpp; a failure (or panic) becomes a message that
/// graph.cpp frees, the error itself kept for the caller.
unsafe extern "C" fn trampoline(ctx: *mut c_void) -> *mut c_char {
    // SAFETY: `ctx` is the `Captured` that `capture` passed.
    let ctx = unsafe { &mut *(ctx as *mut Captured) };
    let error = match panic::catch_unwind(AssertUnwindSafe(|| (ctx.run)())) {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(_) => TrainError::Compile("the compiled step panicked during capture".into()),
    };
    let message = CString::new(error.to_string().replace('\0', " ")).expect("no NUL");
    ctx.error = Some(error);
    // SAFETY: a NUL-terminated string, copied into memory graph.cpp frees with free().
    unsafe { libc::strdup(message.as_ptr()) }
}

/// A captured CUDA graph of one compiled step.
pub struct CudaGraph {
    library: Arc<GraphLibrary>,
    raw: *mut c_void,
}

// SAFETY: the graph is replayed by one replica thread at a time.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Replays the graph on the calling thread's current stream of its device.
    pub fn replay(&self) -> Result<()> {
        // SAFETY: a live graph.
        let e = unsafe { (self.library.replay)(self.raw) };
        self.library
            .check(e, "replaying the compiled step's CUDA graph")
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made by `ddl_graph_capture`, freed once.
        unsafe { (self.library.free)(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The entry's sources as the cache writes them into `dir`, compiled by the compile
    /// script's own function against the torch of the loaded libtorch, with the CUDA headers of
    /// torch's packages (nvidia/cu13/include) as CUDA_HOME: what step.json would say.
    fn build_in(dir: &Path) -> String {
        std::fs::write(dir.join("step.py"), super::super::step::SCRIPT).unwrap();
        for (name, text) in super::super::step::GRAPH_SOURCES {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let script = r#"
import importlib.util, json, os, sys
nvidia = importlib.util.find_spec("nvidia")
if nvidia is not None:
    os.environ["CUDA_HOME"] = os.path.join(nvidia.submodule_search_locations[0], "cu13")
import torch
sys.path.insert(0, sys.argv[1])
import step
print(json.dumps(step.finish_graph_library(step.start_graph_library(torch, sys.argv[1]),
                                           sys.argv[1])))
"#;
        let python = super::super::python::find(None).unwrap();
        let out = Command::new(&python.exe)
            .args(["-c", script])
            .arg(dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Captures `y = 2 x` on the GPU, then replays it with another `x`.
    fn replays_what_it_captured(library: &Arc<GraphLibrary>) {
        use tch::{Device, Kind, Tensor};
        let mut x = Tensor::ones([1024], (Kind::Float, Device::Cuda(0)));
        let mut y = Tensor::zeros([1024], (Kind::Float, Device::Cuda(0)));
        let graph = library
            .capture(0, &mut || {
                y.f_copy_(&(&x * 2.0))?;
                Ok(())
            })
            .unwrap();
        let _ = x.fill_(3.0);
        graph.replay().unwrap();
        assert_eq!(y.min().double_value(&[]), 6.0);
        assert_eq!(y.max().double_value(&[]), 6.0);
    }

    /// Whether this process runs on a libtorch built with CUDA.
    fn cuda_build() -> bool {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing.
        let lib = unsafe {
            libc::dlopen(
                c"libtorch_cuda.so".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        };
        !lib.is_null()
    }

    /// The library opens here, every symbol bound to this process's libtorch_cuda; on a GPU a
    /// capture records what it runs and a replay runs it again on what its tensors then hold,
    /// and without a GPU a capture fails with CUDA's reason instead of running anything; on a
    /// libtorch built without CUDA (LIBTORCH=...) there is no library, or one that names what
    /// it lacks. (The GPU bundle's compile_check stage captures ddl-train's compiled step.)
    #[test]
    fn the_graph_library_compiles_and_opens_against_this_torch() {
        let tmp = tempfile::tempdir().unwrap();
        let said = build_in(tmp.path());
        let opened = GraphLibrary::open(&tmp.path().join(super::super::entry::GRAPH_LIBRARY));
        if !cuda_build() {
            if !said.contains(r#""error""#) {
                let err = opened.err().expect("no libtorch_cuda to bind to");
                assert!(err.to_string().contains("undefined symbol"), "{err}");
            }
            return;
        }
        assert!(said.contains(r#"{"file": "graph.so"}"#), "{said}");
        let library = opened.unwrap();
        if tch::Cuda::is_available() {
            replays_what_it_captured(&library);
            return;
        }
        let mut ran = false;
        let err = library
            .capture(0, &mut || {
                ran = true;
                Ok(())
            })
            .err()
            .expect("no GPU to capture on");
        assert!(!ran);
        assert!(
            err.to_string().contains("capturing the compiled step"),
            "{err}"
        );
    }
}
