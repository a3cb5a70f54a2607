//! SGD with momentum (PyTorch semantics, no dampening), optional Nesterov, and weight decay
//! that skips BatchNorm and bias parameters.

use tch::{Device, Kind, Tensor};

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

/// Momentum state of one replica.
#[derive(Debug)]
pub struct Sgd {
    cfg: SgdConfig,
    decay: Vec<bool>,
    momentum: Vec<Tensor>,
    /// 0-dim tensors on the device: weight decay, momentum, and the last `-lr` used, so that
    /// every update is a few fused in-place kernels without temporaries.
    wd_t: Tensor,
    momentum_t: Tensor,
    neg_lr: Option<(f64, Tensor)>,
    device: Device,
}

impl Sgd {
    /// Zero momentum for parameters of the given shapes on `device`. A zero buffer gives
    /// exactly PyTorch's first step (`buf = grad`), since `0.9 * 0 + g == g`.
    pub fn new(cfg: SgdConfig, shapes: &[Vec<i64>], device: Device) -> Result<Sgd> {
        let decay = shapes.iter().map(|s| decays(s)).collect();
        let momentum = shapes
            .iter()
            .map(|s| Tensor::f_zeros(s.as_slice(), (Kind::Float, device)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let scalar = |v: f64| {
            Tensor::f_from_slice(&[v as f32])?
                .f_reshape([])?
                .f_to_device(device)
        };
        Ok(Sgd {
            cfg,
            decay,
            momentum,
            wd_t: scalar(cfg.weight_decay)?,
            momentum_t: scalar(cfg.momentum)?,
            neg_lr: None,
            device,
        })
    }

    /// The momentum buffers, one per parameter in parameter order.
    pub fn momentum(&self) -> &[Tensor] {
        &self.momentum
    }

    /// Applies one update to parameter `i` given its (already averaged) gradient, which is
    /// used as scratch space and left modified:
    /// `g += wd * p` (decayed parameters only); `buf = momentum * buf + g`;
    /// `p -= lr * (nesterov ? g + momentum * buf : buf)`.
    pub fn update(
        &mut self,
        i: usize,
        param: &mut Tensor,
        grad: &mut Tensor,
        lr: f64,
    ) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let neg_lr = match &self.neg_lr {
            Some((v, t)) if *v == lr => t.shallow_clone(),
            _ => {
                let t = Tensor::f_from_slice(&[-lr as f32])?
                    .f_reshape([])?
                    .f_to_device(self.device)?;
                self.neg_lr = Some((lr, t.shallow_clone()));
                t
            }
        };
        if self.decay[i] && self.cfg.weight_decay != 0.0 {
            let _ = grad.f_addcmul_(param, &self.wd_t)?;
        }
        if self.cfg.momentum != 0.0 {
            let buf = &mut self.momentum[i];
            let _ = buf.f_mul_scalar_(self.cfg.momentum)?;
            let _ = buf.f_add_(grad)?;
            if self.cfg.nesterov {
                let _ = grad.f_addcmul_(buf, &self.momentum_t)?;
                let _ = param.f_addcmul_(grad, &neg_lr)?;
            } else {
                let _ = param.f_addcmul_(buf, &neg_lr)?;
            }
        } else {
            let _ = param.f_addcmul_(grad, &neg_lr)?;
        }
        Ok(())
    }
}
