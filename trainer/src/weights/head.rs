//! Which keys of a state dict are the classifier head.

/// Whether `key` belongs to the classifier head (`fc.weight`, `fc.bias`), the part
/// `reset_head` re-initialises.
pub fn is_head(key: &str) -> bool {
    key.starts_with("fc.")
}
