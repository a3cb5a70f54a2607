//! SGD with momentum (PyTorch semantics, no dampening), optional Nesterov, and weight decay
//! that skips BatchNorm and bias parameters, applied a bucket at a time: the weights,
//! gradients and momentum of a bucket are ranges of flat buffers (see [`crate::table::Layout`]),
//! so an update is a handful of kernels whatever the number of parameters in it, as PyTorch's
//! fused SGD does.

use tch::{Device, Tensor};

use crate::error::Result;

/// Hyper-parameters of the optimizer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Momentum factor (0.9).
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty applied to parameters whose `decay` flag is set (1e-4).
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
        }
    }
}

/// Whether weight decay applies to a parameter of this shape: only to convolution and linear
/// weights (two or more dimensions), never to BatchNorm scales/shifts or biases (one dimension).
pub fn decays(shape: &[i64]) -> bool {
    shape.len() >= 2
}

/// The optimizer of one replica. Its hyper-parameters and the learning rate live on the device
/// as 0-dim tensors, so that no update uploads anything or waits for the device.
#[derive(Debug)]
pub struct Sgd {
    cfg: SgdConfig,
    wd: Tensor,
    momentum: Tensor,
    neg_lr: Tensor,
    lr: Option<f64>,
}

impl Sgd {
    /// The optimizer on `device`. Momentum buffers start at zero, which gives exactly
    /// PyTorch's first step (`buf = grad`), since `0.9 * 0 + g == g`.
    pub fn new(cfg: SgdConfig, device: Device) -> Result<Sgd> {
        let scalar = |v: f64| {
            Tensor::f_from_slice(&[v as f32])?
                .f_reshape([])?
                .f_to_device(device)
        };
        Ok(Sgd {
            cfg,
            wd: scalar(cfg.weight_decay)?,
            momentum: scalar(cfg.momentum)?,
            neg_lr: scalar(0.0)?,
            lr: None,
        })
    }

    /// Sets the learning rate of the next updates (a kernel on the device when it changes).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if self.lr != Some(lr) {
            let _ = self.neg_lr.f_fill_(f64::from(-lr as f32))?;
            self.lr = Some(lr);
        }
        Ok(())
    }

    /// Updates one bucket given its (already averaged) gradient, which is used as scratch
    /// space and left modified. `params`, `grads` and `momentum` are the bucket's ranges of
    /// the flat buffers; the first `decayed` elements get weight decay:
    /// `g += wd * p`; `buf = momentum * buf + g`;
    /// `p -= lr * (nesterov ? g + momentum * buf : buf)`.
    pub fn update(
        &self,
        params: &mut Tensor,
        grads: &mut Tensor,
        momentum: &mut Tensor,
        decayed: usize,
    ) -> Result<()> {
        let _guard = tch::no_grad_guard();
        if decayed > 0 && self.cfg.weight_decay != 0.0 {
            let n = decayed as i64;
            let _ = grads
                .f_narrow(0, 0, n)?
                .f_addcmul_(&params.f_narrow(0, 0, n)?, &self.wd)?;
        }
        if self.cfg.momentum != 0.0 {
            let _ = momentum.f_mul_scalar_(self.cfg.momentum)?;
            let _ = momentum.f_add_(grads)?;
            if self.cfg.nesterov {
                let _ = grads.f_addcmul_(momentum, &self.momentum)?;
                let _ = params.f_addcmul_(grads, &self.neg_lr)?;
            } else {
                let _ = params.f_addcmul_(momentum, &self.neg_lr)?;
            }
        } else {
            let _ = params.f_addcmul_(grads, &self.neg_lr)?;
        }
        Ok(())
    }
}
