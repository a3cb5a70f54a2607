//! Devices: parsing of `--devices` (which local devices get a model replica), waiting for a
//! device, and the CUDA autocast dtype that tch does not expose.

use tch::{Cuda, Device};

use crate::config::Precision;
use crate::error::{Result, TrainError};

/// Parses a device list.
///
/// * `auto`: the GPUs visible to this process, split evenly between the `ranks_in_node`
///   ranks of the node (local rank `rank_in_node` takes its contiguous share); `cpu:1` when
///   there are fewer GPUs than local ranks.
/// * `cpu` or `cpu:N`: N replicas on the CPU (one intra-op thread each).
/// * `cuda`: every visible GPU; `cuda:0,1,2,3` or `cuda:0,cuda:1`: those GPUs.
pub fn parse_devices(spec: &str, rank_in_node: usize, ranks_in_node: usize) -> Result<Vec<Device>> {
    let bad = |m: String| TrainError::config("--devices", m);
    let spec = spec.trim();
    if spec == "auto" {
        let gpus = Cuda::device_count().max(0) as usize;
        let ranks = ranks_in_node.max(1);
        if gpus >= ranks {
            let per = gpus / ranks;
            let first = rank_in_node * per;
            return Ok((first..first + per).map(Device::Cuda).collect());
        }
        return Ok(vec![Device::Cpu]);
    }
    if spec == "cpu" {
        return Ok(vec![Device::Cpu]);
    }
    if let Some(n) = spec.strip_prefix("cpu:") {
        let n: usize = n
            .parse()
            .map_err(|_| bad(format!("{spec:?}: expected cpu:N with N >= 1")))?;
        if n == 0 {
            return Err(bad(format!("{spec:?}: expected cpu:N with N >= 1")));
        }
        return Ok(vec![Device::Cpu; n]);
    }
    let gpus = Cuda::device_count().max(0) as usize;
    if spec == "cuda" {
        if gpus == 0 {
            return Err(bad("cuda: no CUDA device is visible".into()));
        }
        return Ok((0..gpus).map(Device::Cuda).collect());
    }
    if let Some(list) = spec.strip_prefix("cuda:") {
        let mut devices = Vec::new();
        for item in list.split(',') {
            let item = item.trim();
            let idx = item.strip_prefix("cuda:").unwrap_or(item);
            let i: usize = idx
                .parse()
                .map_err(|_| bad(format!("{spec:?}: {item:?} is not a GPU index")))?;
            if i >= gpus {
                return Err(bad(format!(
                    "{spec:?}: cuda:{i} requested but {gpus} CUDA device(s) visible"
                )));
            }
            if devices.contains(&Device::Cuda(i)) {
                return Err(bad(format!("{spec:?}: cuda:{i} listed twice")));
            }
            devices.push(Device::Cuda(i));
        }
        return Ok(devices);
    }
    Err(bad(format!(
        "{spec:?}: expected auto, cpu, cpu:N, cuda or cuda:I,J,..."
    )))
}

/// Waits until every operation queued on `device` has finished (nothing to wait for on the
/// CPU).
pub fn sync_device(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_forms() {
        assert_eq!(parse_devices("cpu", 0, 1).unwrap(), vec![Device::Cpu]);
        assert_eq!(parse_devices("cpu:3", 0, 1).unwrap(), vec![Device::Cpu; 3]);
        for bad in ["cpu:0", "cpu:x", "tpu", "cuda:a", ""] {
            let e = parse_devices(bad, 0, 1).unwrap_err().to_string();
            assert!(e.contains("--devices"), "{bad}: {e}");
        }
    }

    #[test]
    fn auto_without_gpu_is_one_cpu_replica() {
        if Cuda::device_count() == 0 {
            assert_eq!(parse_devices("auto", 0, 2).unwrap(), vec![Device::Cpu]);
            assert!(parse_devices("cuda:0", 0, 1).is_err());
        }
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
