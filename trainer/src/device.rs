//! Parsing of `--devices`: which local devices get a model replica.

use tch::{Cuda, Device};

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
}
