//! 64-bit FNV-1a over length-delimited fields: the hash behind plan and pack fingerprints and
//! the held-out split's keys. Stable across builds and platforms, unlike `DefaultHasher`, so a
//! fingerprint written to disk by one build is recognised by the next.

/// The running hash.
pub(crate) struct Fnv(pub u64);

impl Fnv {
    /// The FNV-1a 64 offset basis.
    pub fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Adds one field: its bytes, then its length, so that concatenations cannot collide.
    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        for x in (b.len() as u64).to_le_bytes() {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash as 16 hex digits, as fingerprints are written.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}
