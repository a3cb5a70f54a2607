//! The validation accuracy a run last measured ([`EvalAt`]).

/// The validation accuracy of the weights after `step` global steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct EvalAt {
    /// Global step of the weights evaluated.
    pub(super) step: u64,
    /// Top-1 accuracy (`None` when no val image was scored).
    pub(super) top1: Option<f64>,
    /// Top-5 accuracy.
    pub(super) top5: Option<f64>,
}
