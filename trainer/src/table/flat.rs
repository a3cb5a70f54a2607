//! A replica's weights, gradients and momentum, each one flat f32 buffer in [`Layout`] order.
//! Every parameter is a view of its range of the weights, and its `.grad` a view of the same
//! range of the gradients, so backward writes straight into the buffers the buckets are summed
//! and reduced from, and the optimizer updates a bucket as one range. A channels-last
//! parameter's views have channels-last strides in all three buffers, so every update is
//! element-wise over matching elements.

use tch::{Device, Kind, Tensor};

use crate::device;
use crate::error::Result;

use super::buckets::{Bucket, Layout, ParamInfo};

/// The three flat buffers of one replica.
pub(crate) struct Flat {
    /// Weights (the parameters' storage).
    pub(crate) params: Tensor,
    /// Gradients (the parameters' `.grad`), summed in place along the table's tree.
    pub(crate) grads: Tensor,
    /// Momentum.
    pub(crate) momentum: Tensor,
}

impl Flat {
    /// Zeroed buffers for `layout` on `device`.
    pub(crate) fn zeros(layout: &Layout, device: Device) -> Result<Flat> {
        let zeros = || Tensor::f_zeros([layout.total as i64], (Kind::Float, device));
        Ok(Flat {
            params: zeros()?,
            grads: zeros()?,
            momentum: zeros()?,
        })
    }

    /// Moves every parameter of `params` (in [`Layout::params`] order) into the buffers: its
    /// values are copied into its range of the weights, which becomes its storage, and its
    /// `.grad` becomes its range of the gradients; 4-D parameters get channels-last strides
    /// when `channels_last`.
    pub(crate) fn adopt(
        &self,
        layout: &Layout,
        params: &mut [Tensor],
        channels_last: bool,
    ) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (p, info) in params.iter_mut().zip(&layout.params) {
            let mut weights = view(&self.params, info, channels_last)?;
            weights.f_copy_(p)?;
            p.f_set_data(&weights)?;
            device::set_grad(p, &view(&self.grads, info, channels_last)?)?;
        }
        Ok(())
    }

    /// The momentum of every parameter, shaped (and strided) as the parameter.
    pub(crate) fn momentum_views(
        &self,
        layout: &Layout,
        channels_last: bool,
    ) -> Result<Vec<Tensor>> {
        layout
            .params
            .iter()
            .map(|info| view(&self.momentum, info, channels_last))
            .collect()
    }
}

/// The range of `bucket` in the flat buffer `t`.
pub(crate) fn range(t: &Tensor, bucket: &Bucket) -> Result<Tensor> {
    Ok(t.f_narrow(0, bucket.start as i64, bucket.len as i64)?)
}

/// The range of parameter `info` in the flat buffer `t`, shaped as the parameter: NCHW, or
/// NHWC strides for a 4-D parameter when `channels_last`.
fn view(t: &Tensor, info: &ParamInfo, channels_last: bool) -> Result<Tensor> {
    let range = t.f_narrow(0, info.offset as i64, info.numel as i64)?;
    Ok(match info.shape.as_slice() {
        &[o, i, h, w] if channels_last => range.f_view([o, h, w, i])?.f_permute([0, 3, 1, 2])?,
        shape => range.f_view(shape)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn;

    fn layout_of(vs: &nn::VarStore) -> Layout {
        Layout::new(vs, usize::MAX)
    }

    #[test]
    fn parameters_and_gradients_live_in_the_flat_buffers() {
        for channels_last in [false, true] {
            let vs = nn::VarStore::new(Device::Cpu);
            let conv = nn::conv2d(vs.root() / "c", 2, 3, 3, Default::default());
            let layout = layout_of(&vs);
            let mut params: Vec<Tensor> = layout
                .params
                .iter()
                .map(|p| vs.variables()[&p.name].shallow_clone())
                .collect();
            let before: Vec<Tensor> = params.iter().map(|p| p.copy()).collect();
            let flat = Flat::zeros(&layout, Device::Cpu).unwrap();
            flat.adopt(&layout, &mut params, channels_last).unwrap();
            for (p, b) in params.iter().zip(&before) {
                assert!(p.equal(b), "values kept");
            }
            let w = &params[layout
                .params
                .iter()
                .position(|p| p.shape.len() == 4)
                .unwrap()];
            assert_eq!(w.is_contiguous(), !channels_last);
            // The module computes with the flat storage and backward fills the flat gradients.
            let x = Tensor::ones([1, 2, 5, 5], (Kind::Float, Device::Cpu));
            x.apply(&conv).sum(Kind::Float).backward();
            let total: f64 = params
                .iter()
                .map(|p| p.grad().abs().sum(Kind::Float).double_value(&[]))
                .sum();
            let flat_total = flat.grads.abs().sum(Kind::Float).double_value(&[]);
            assert!(
                total > 0.0 && (total - flat_total).abs() < 1e-3,
                "{total} {flat_total}"
            );
            // An update of the flat weights is an update of the parameters.
            let _ = flat.params.shallow_clone().f_add_scalar_(1.0).unwrap();
            assert!(params[0].equal(&(&before[0] + 1.0)));
            let m = flat.momentum_views(&layout, channels_last).unwrap();
            assert_eq!(m[0].size(), params[0].size());
            assert_eq!(m[0].stride(), params[0].stride());
        }
    }
}
