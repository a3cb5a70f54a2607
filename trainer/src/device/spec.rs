//! `devices`: which local devices get a model replica.

use std::fmt;
use std::str::FromStr;

use tch::{Cuda, Device};

use crate::flag_value::flag_value_from_str;

/// What is wrong with a `devices` value: its form, or a GPU it names that is not visible
/// (an error of the run names the setting: `From` in [`crate::error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DeviceSpecError(String);

/// `devices`: which local devices get a model replica.
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
    /// `cuda:0,1,2,3` or `cuda:0,cuda:1`: these GPUs, a replica each; a GPU listed twice
    /// (`cuda:0,0`) holds two replicas, so that the multi-replica path runs on one GPU.
    Cuda(Vec<usize>),
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    /// Checks the form only; whether the GPUs exist is checked by [`DeviceSpec::resolve`].
    fn from_str(spec: &str) -> Result<DeviceSpec, DeviceSpecError> {
        let bad = DeviceSpecError;
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

flag_value_from_str!(DeviceSpec);

impl DeviceSpec {
    /// The devices of local rank `rank_in_node` of `ranks_in_node`; fails when a GPU asked for
    /// is not visible.
    pub fn resolve(
        &self,
        rank_in_node: usize,
        ranks_in_node: usize,
    ) -> Result<Vec<Device>, DeviceSpecError> {
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
            DeviceSpec::AllCuda if gpus == 0 => Err(DeviceSpecError(
                "cuda: no CUDA device is visible".to_string(),
            )),
            DeviceSpec::AllCuda => Ok((0..gpus).map(Device::Cuda).collect()),
            DeviceSpec::Cuda(list) => list
                .iter()
                .map(|&i| {
                    if i < gpus {
                        Ok(Device::Cuda(i))
                    } else {
                        Err(DeviceSpecError(format!(
                            "{self}: cuda:{i} requested but {gpus} CUDA device(s) visible"
                        )))
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_devices(
        spec: &str,
        rank_in_node: usize,
        ranks_in_node: usize,
    ) -> Result<Vec<Device>, DeviceSpecError> {
        spec.parse::<DeviceSpec>()?
            .resolve(rank_in_node, ranks_in_node)
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(parse_devices("cpu", 0, 1).unwrap(), vec![Device::Cpu]);
        assert_eq!(parse_devices("cpu:3", 0, 1).unwrap(), vec![Device::Cpu; 3]);
        for bad in ["cpu:0", "cpu:x", "tpu", "cuda:a", ""] {
            let e = parse_devices(bad, 0, 1).unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("{bad:?}: ")),
                "{bad}: {e}"
            );
        }
        let e = crate::TrainError::from("tpu".parse::<DeviceSpec>().unwrap_err());
        assert!(
            e.to_string().starts_with("invalid --devices: \"tpu\""),
            "{e}"
        );
    }

    #[test]
    fn a_gpu_listed_twice_holds_two_replicas() {
        let spec: DeviceSpec = "cuda:0,0".parse().unwrap();
        assert_eq!(spec, DeviceSpec::Cuda(vec![0, 0]));
        assert_eq!(spec.to_string(), "cuda:0,0");
        if Cuda::device_count() > 0 {
            assert_eq!(
                spec.resolve(0, 1).unwrap(),
                vec![Device::Cuda(0), Device::Cuda(0)]
            );
        }
    }

    #[test]
    fn auto_without_gpu_is_one_cpu_replica() {
        if Cuda::device_count() == 0 {
            assert_eq!(parse_devices("auto", 0, 2).unwrap(), vec![Device::Cpu]);
            assert!(parse_devices("cuda:0", 0, 1).is_err());
        }
    }
}
