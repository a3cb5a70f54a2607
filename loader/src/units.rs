//! Byte counts in the units messages and tables print them in: one definition of each; and the
//! one rule for byte sizes on every ddl command line ([`parse_size`]): binary units with an `i`
//! (KiB, MiB, GiB, TiB = powers of 1024), decimal units without (KB, MB, GB, TB = powers of
//! 1000), and a bare letter (K, M, G, T) binary, as `ls -h` and MPI tools print them. A fraction
//! is allowed (`1.5GiB`); the result is a whole number of bytes, at least one.

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

/// The rule, for `--help` texts.
pub const SIZE_HELP: &str =
    "bytes, or with a unit: KiB/MiB/GiB/TiB and K/M/G/T are powers of 1024, KB/MB/GB/TB of 1000";

/// Parses a size such as `1GiB`, `512MiB`, `2G`, `100MB`, `4096` (bytes) by the rule above.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with an optional unit ({SIZE_HELP})"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        u => return Err(format!("{s:?}: unknown unit {u:?} ({SIZE_HELP})")),
    };
    let v = num * mult as f64;
    if !(1.0..1.8e19).contains(&v) {
        return Err(format!("{s:?}: size must be between one byte and 16 EiB"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_with_i_or_a_bare_letter_decimal_without() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_size("256mb").unwrap(), 256_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("1 parsec").is_err());
        assert!(parse_size("0").is_err());
    }
}
