//! The name and compute capability of a CUDA device, for the compile-cache key: a package
//! holds machine code for one GPU architecture. Read through the CUDA driver's C API (the
//! libcuda.so.1 that libtorch's CUDA backend loads), as libtorch exposes no such call to C++
//! without the CUDA headers.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::error::{Result, TrainError};

type Init = unsafe extern "C" fn(u32) -> c_int;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type Attribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;

const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// A symbol of the driver library `lib`.
unsafe fn symbol(lib: *mut c_void, name: &CStr) -> Result<*mut c_void> {
    let f = libc::dlsym(lib, name.as_ptr());
    if f.is_null() {
        return Err(TrainError::Compile(format!(
            "libcuda.so.1 has no {}",
            name.to_string_lossy()
        )));
    }
    Ok(f)
}

/// `"<name> sm_<major><minor>"` of CUDA device `index`, e.g. `NVIDIA H200 sm_90`.
pub fn describe(index: usize) -> Result<String> {
    let fail = |what: &str, code: c_int| {
        TrainError::Compile(format!("CUDA driver: {what} failed (error {code})"))
    };
    // SAFETY: plain C calls of the driver API with valid out-pointers; the library stays
    // loaded (libtorch holds it too).
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        let lib = if lib.is_null() {
            libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW)
        } else {
            lib
        };
        if lib.is_null() {
            return Err(TrainError::Compile("cannot load libcuda.so.1".into()));
        }
        let init: Init = std::mem::transmute(symbol(lib, c"cuInit")?);
        let get: DeviceGet = std::mem::transmute(symbol(lib, c"cuDeviceGet")?);
        let attribute: Attribute = std::mem::transmute(symbol(lib, c"cuDeviceGetAttribute")?);
        let name: Name = std::mem::transmute(symbol(lib, c"cuDeviceGetName")?);
        let rc = init(0);
        if rc != 0 {
            return Err(fail("cuInit", rc));
        }
        let mut device = 0;
        let rc = get(&mut device, index as c_int);
        if rc != 0 {
            return Err(fail("cuDeviceGet", rc));
        }
        let (mut major, mut minor) = (0, 0);
        for (attr, out) in [
            (COMPUTE_CAPABILITY_MAJOR, &mut major),
            (COMPUTE_CAPABILITY_MINOR, &mut minor),
        ] {
            let rc = attribute(out, attr, device);
            if rc != 0 {
                return Err(fail("cuDeviceGetAttribute", rc));
            }
        }
        let mut buf = [0 as c_char; 256];
        let rc = name(buf.as_mut_ptr(), buf.len() as c_int, device);
        if rc != 0 {
            return Err(fail("cuDeviceGetName", rc));
        }
        let name = CStr::from_ptr(buf.as_ptr()).to_string_lossy();
        Ok(format!("{name} sm_{major}{minor}"))
    }
}
