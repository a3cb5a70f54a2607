//! Copies between host memory and tensors on any device, and loader batches as tensors.

use ddl_loader::pipeline::{Batch, Images};
use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Copies `src` (any device) into the host slice `dst`.
pub(crate) fn to_host(src: &Tensor, dst: &mut [f32]) -> Result<()> {
    // SAFETY: the blob views `dst`, which outlives it and is exclusively borrowed here.
    let mut blob = unsafe {
        Tensor::from_blob(
            dst.as_mut_ptr() as *const u8,
            &[dst.len() as i64],
            &[1],
            Kind::Float,
            Device::Cpu,
        )
    };
    blob.f_copy_(src)?;
    Ok(())
}

/// Copies the host slice `src`, the elements of `dst` in logical (row-major) order, into `dst`
/// (any device, any strides: channels-last weights too).
pub(crate) fn from_host(dst: &mut Tensor, src: &[f32]) -> Result<()> {
    let size = dst.size();
    if dst.numel() != src.len() {
        return Err(tch::TchError::Shape(format!(
            "{} host values for a tensor of shape {size:?}",
            src.len()
        ))
        .into());
    }
    // SAFETY: the blob views `src`, which outlives it, holds exactly the blob's elements (checked
    // above) and is only read.
    let blob = unsafe {
        Tensor::from_blob(
            src.as_ptr() as *const u8,
            &size,
            &[],
            Kind::Float,
            Device::Cpu,
        )
    };
    dst.f_copy_(&blob)?;
    Ok(())
}

/// `t` (4-D, NCHW) with channels-last strides: the same logical tensor, stored NHWC.
pub(crate) fn channels_last(t: &Tensor) -> Result<Tensor> {
    Ok(t.f_permute([0, 2, 3, 1])?
        .f_contiguous()?
        .f_permute([0, 3, 1, 2])?)
}

pub(crate) fn tensor_to_vec(t: &Tensor) -> Result<Vec<f32>> {
    let flat = t.f_detach()?.f_to_kind(Kind::Float)?.f_flatten(0, -1)?;
    let mut v = vec![0f32; flat.numel()];
    to_host(&flat, &mut v)?;
    Ok(v)
}

/// Makes loader images into the tensors a replica computes on: uint8 NHWC pixels become
/// normalized f32 on the device (the mean and std stay there), stored channels-last when asked.
pub(crate) struct Normalizer {
    mean: Tensor,
    std: Tensor,
    nhwc: bool,
}

impl Normalizer {
    /// The normalizer of `device` with `(mean, std)`; images stored channels-last when `nhwc`.
    pub(crate) fn new(
        device: Device,
        nhwc: bool,
        (mean, std): ([f32; 3], [f32; 3]),
    ) -> Result<Normalizer> {
        let on_device = |v: &[f32]| -> Result<Tensor> {
            Ok(Tensor::f_from_slice(v)?
                .f_view([1, 3, 1, 1])?
                .f_to_device(device)?)
        };
        Ok(Normalizer {
            mean: on_device(&mean)?,
            std: on_device(&std)?,
            nhwc,
        })
    }

    /// `[n, h, w, 3]` uint8 pixels (on the normalizer's device) as a normalized f32 NCHW
    /// tensor: `(x / 255 - mean) / std`, as the loader's f32 output.
    pub(crate) fn u8_nhwc(&self, pixels: &Tensor) -> Result<Tensor> {
        let mut t = pixels.f_permute([0, 3, 1, 2])?.f_to_kind(Kind::Float)?;
        let _ = t.f_div_scalar_(255.0)?;
        let _ = t.f_sub_(&self.mean)?;
        let _ = t.f_div_(&self.std)?;
        self.layout(t)
    }

    /// `t` (4-D, NCHW) stored as the replica computes on it: channels-last or contiguous. A
    /// uint8 NHWC batch is channels-last after the permute already, so then nothing is copied.
    pub(crate) fn layout(&self, t: Tensor) -> Result<Tensor> {
        Ok(if self.nhwc {
            channels_last(&t)?
        } else {
            t.f_contiguous()?
        })
    }
}

/// A loader batch and the tensors made from it: images (NCHW f32) and labels (i64), on the
/// replica's device. On the CPU the image tensor views the batch's buffer without a copy, so
/// the guard owns both: the tensors are only lent out, a [`crate::model::StagedPass`] built on
/// them borrows the guard, and the guard drops its tensors before the batch (fields drop in
/// declaration order).
pub(crate) struct BatchTensors {
    images: Tensor,
    labels: Tensor,
    batch: Batch,
}

impl BatchTensors {
    /// The tensors of `batch` on `device` (copied there and waited for when it is a GPU).
    pub(crate) fn new(batch: Batch, device: Device, norm: &Normalizer) -> Result<BatchTensors> {
        let labels = Tensor::f_from_slice(&batch.labels)?.f_to_device(device)?;
        let images = images_tensor(&batch.images, batch.shape(), device, norm)?;
        Ok(BatchTensors {
            images,
            labels,
            batch,
        })
    }

    /// The images, `[n, 3, h, w]`.
    pub(crate) fn images(&self) -> &Tensor {
        &self.images
    }

    /// The labels, `[n]`.
    pub(crate) fn labels(&self) -> &Tensor {
        &self.labels
    }

    /// The loader batch the tensors were made from.
    pub(crate) fn batch(&self) -> &Batch {
        &self.batch
    }
}

/// The loader's `images` of `shape` (`[n, 3, h, w]` for f32, `[n, h, w, 3]` for u8) as a
/// host tensor viewing them (no copy).
///
/// # Safety
/// The tensor must not outlive `images`.
pub(crate) unsafe fn host_view(images: &Images, shape: [usize; 4]) -> Tensor {
    let dims = shape.map(|d| d as i64);
    let (ptr, kind) = match images {
        Images::F32(v) => (v.as_ptr() as *const u8, Kind::Float),
        Images::U8(v) => (v.as_ptr(), Kind::Uint8),
    };
    Tensor::from_blob(ptr, &dims, &[], kind, Device::Cpu)
}

/// The loader's `images` of `shape` as a normalized f32 NCHW tensor on `device` (see
/// [`Normalizer`]). On the CPU an f32 tensor aliases `images`.
fn images_tensor(
    images: &Images,
    shape: [usize; 4],
    device: Device,
    norm: &Normalizer,
) -> Result<Tensor> {
    // SAFETY: the caller keeps the batch (and so `images`) alive as long as the tensor.
    let host = unsafe { host_view(images, shape) };
    let t = host.f_to_device(device)?;
    match images {
        Images::F32(_) => norm.layout(t),
        Images::U8(_) => norm.u8_nhwc(&t),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use ddl_loader::pipeline::{IMAGENET_MEAN, IMAGENET_STD};

    /// NHWC strides of an NCHW shape.
    fn nhwc_strides(t: &Tensor) -> Vec<i64> {
        let s = t.size();
        vec![s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]]
    }

    #[test]
    fn channels_last_keeps_values_and_changes_strides() {
        let t = Tensor::arange(2 * 3 * 4 * 5, (Kind::Float, Device::Cpu)).view([2, 3, 4, 5]);
        let cl = channels_last(&t).unwrap();
        assert_eq!(cl.stride(), nhwc_strides(&t));
        assert!(cl.equal(&t));
        // from_host writes logical order into any strides; tensor_to_vec reads it back.
        let values: Vec<f32> = (0..120).map(|i| i as f32 * 0.5).collect();
        let mut dst =
            channels_last(&Tensor::zeros([2, 3, 4, 5], (Kind::Float, Device::Cpu))).unwrap();
        from_host(&mut dst, &values).unwrap();
        assert_eq!(dst.stride(), nhwc_strides(&t));
        assert_eq!(tensor_to_vec(&dst).unwrap(), values);
        assert!(from_host(&mut dst, &values[1..]).is_err());
    }

    #[test]
    fn images_tensor_layouts_agree() {
        let (n, h, w) = (2usize, 3usize, 4usize);
        let u8s: Vec<u8> = (0..n * h * w * 3).map(|i| (i * 7 % 256) as u8).collect();
        let u8_images = Images::U8(u8s.clone());
        let imagenet = (IMAGENET_MEAN, IMAGENET_STD);
        let plain = Normalizer::new(Device::Cpu, false, imagenet).unwrap();
        let cl = Normalizer::new(Device::Cpu, true, imagenet).unwrap();
        let nchw = images_tensor(&u8_images, [n, h, w, 3], Device::Cpu, &plain).unwrap();
        let nhwc = images_tensor(&u8_images, [n, h, w, 3], Device::Cpu, &cl).unwrap();
        assert_eq!(nchw.size(), [2, 3, 3, 4]);
        assert!(nchw.is_contiguous());
        assert_eq!(nhwc.stride(), nhwc_strides(&nchw));
        assert!(nhwc.equal(&nchw));
        // Pixel (image 1, row 2, column 3), channel 1, normalized as the loader's f32 output.
        let raw = u8s[((n - 1) * h * w + 2 * w + 3) * 3 + 1] as f64;
        let want = (raw / 255.0 - IMAGENET_MEAN[1] as f64) / IMAGENET_STD[1] as f64;
        let got = nhwc.double_value(&[1, 1, 2, 3]);
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        let f32s: Vec<f32> = (0..n * 3 * h * w).map(|i| i as f32).collect();
        let f32_images = Images::F32(f32s);
        let a = images_tensor(&f32_images, [n, 3, h, w], Device::Cpu, &plain).unwrap();
        let b = images_tensor(&f32_images, [n, 3, h, w], Device::Cpu, &cl).unwrap();
        assert_eq!(b.stride(), nhwc_strides(&a));
        assert!(a.equal(&b));
    }
}
