//! Devices: parsing of `--devices` (which local devices get a model replica), waiting for a
//! device, and the CUDA autocast dtype that tch does not expose.

use std::fmt;
use std::str::FromStr;

use tch::{Cuda, Device};

use crate::config::Precision;
use crate::error::{Result, TrainError};

/// `--devices`: which local devices get a model replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// `auto`: the GPUs visible to this process, split evenly between the ranks of the node
    /// (each local rank takes its contiguous share); one CPU replica when there are fewer GPUs
    /// than local ranks.
    Auto,
    /// `cpu` or `cpu:N`: N replicas on the CPU (one intra-op thread each).
    Cpu(usize),
    /// `cuda`: every visible GPU.
    AllCuda,
    /// `cuda:0,1,2,3` or `cuda:0,cuda:1`: these GPUs.
    Cuda(Vec<usize>),
}

impl FromStr for DeviceSpec {
    type Err = TrainError;

    /// Checks the form only; whether the GPUs exist is checked by [`DeviceSpec::resolve`].
    fn from_str(spec: &str) -> Result<DeviceSpec> {
        let bad = |m: String| TrainError::config("--devices", m);
        let spec = spec.trim();
        match spec {
            "auto" => return Ok(DeviceSpec::Auto),
            "cpu" => return Ok(DeviceSpec::Cpu(1)),
            "cuda" => return Ok(DeviceSpec::AllCuda),
            _ => {}
        }
        if let Some(n) = spec.strip_prefix("cpu:") {
            return match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(DeviceSpec::Cpu(n)),
                _ => Err(bad(format!("{spec:?}: expected cpu:N with N >= 1"))),
            };
        }
        let Some(list) = spec.strip_prefix("cuda:") else {
            return Err(bad(format!(
                "{spec:?}: expected auto, cpu, cpu:N, cuda or cuda:I,J,..."
            )));
        };
        let mut gpus = Vec::new();
        for item in list.split(',') {
            let item = item.trim();
            let idx = item.strip_prefix("cuda:").unwrap_or(item);
            let i: usize = idx
                .parse()
                .map_err(|_| bad(format!("{spec:?}: {item:?} is not a GPU index")))?;
            if gpus.contains(&i) {
                return Err(bad(format!("{spec:?}: cuda:{i} listed twice")));
            }
            gpus.push(i);
        }
        Ok(DeviceSpec::Cuda(gpus))
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu(n) => write!(f, "cpu:{n}"),
            DeviceSpec::AllCuda => f.write_str("cuda"),
            DeviceSpec::Cuda(gpus) => {
                let list: Vec<String> = gpus.iter().map(usize::to_string).collect();
                write!(f, "cuda:{}", list.join(","))
            }
        }
    }
}

impl DeviceSpec {
    /// The devices of local rank `rank_in_node` of `ranks_in_node`; fails, naming
    /// `--devices`, when a GPU asked for is not visible.
    pub fn resolve(&self, rank_in_node: usize, ranks_in_node: usize) -> Result<Vec<Device>> {
        let gpus = Cuda::device_count().max(0) as usize;
        match self {
            DeviceSpec::Auto => {
                let ranks = ranks_in_node.max(1);
                if gpus >= ranks {
                    let per = gpus / ranks;
                    let first = rank_in_node * per;
                    return Ok((first..first + per).map(Device::Cuda).collect());
                }
                Ok(vec![Device::Cpu])
            }
            DeviceSpec::Cpu(n) => Ok(vec![Device::Cpu; *n]),
            DeviceSpec::AllCuda if gpus == 0 => Err(TrainError::config(
                "--devices",
                "cuda: no CUDA device is visible",
            )),
            DeviceSpec::AllCuda => Ok((0..gpus).map(Device::Cuda).collect()),
            DeviceSpec::Cuda(list) => list
                .iter()
                .map(|&i| {
                    if i < gpus {
                        Ok(Device::Cuda(i))
                    } else {
                        Err(TrainError::config(
                            "--devices",
                            format!("{self}: cuda:{i} requested but {gpus} CUDA device(s) visible"),
                        ))
                    }
                })
                .collect(),
        }
    }
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

    fn parse_devices(spec: &str, rank_in_node: usize, ranks_in_node: usize) -> Result<Vec<Device>> {
        spec.parse::<DeviceSpec>()?
            .resolve(rank_in_node, ranks_in_node)
    }

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
