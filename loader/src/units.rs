//! Byte counts in the units messages and tables print them in: one definition of each.

/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// `bytes` in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// `bytes` in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// `bytes` in decimal megabytes (10^6), as model sizes are quoted.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}
