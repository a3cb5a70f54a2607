//! What the ranks of one allreduce call must agree on: the element count and type of their
//! buffers ([`Signature`]), as a word on the wire and as a message naming each rank's call
//! ([`describe_calls`]). How the ranks compare them is [`super::call_check`].

/// Bytes of a call's word on the wire (one to every other rank).
pub const CALL_CHECK_WORD: usize = std::mem::size_of::<u64>();

/// An element type of the allreduce ([`super::Element`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// f32.
    F32 = 1,
    /// IEEE half precision.
    F16 = 2,
    /// bfloat16.
    Bf16 = 3,
}

impl Dtype {
    /// The name users see (as the command lines spell the element type).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    fn from_code(code: u64) -> Option<Dtype> {
        match code {
            1 => Some(Dtype::F32),
            2 => Some(Dtype::F16),
            3 => Some(Dtype::Bf16),
            _ => None,
        }
    }
}

/// One rank's call: how many elements of which type it reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Elements in the buffer.
    pub count: u64,
    /// Their type.
    pub dtype: Dtype,
}

impl Signature {
    /// The call of a buffer of `count` elements of `dtype`.
    pub fn new(dtype: Dtype, count: usize) -> Signature {
        Signature {
            count: count as u64,
            dtype,
        }
    }

    /// As one word, never 0 (so a word still 0 was never written): the count above the type.
    pub(crate) fn to_word(self) -> u64 {
        (self.count << 8) | self.dtype as u64
    }

    /// The signature of a word written by [`Signature::to_word`], `None` for any other.
    pub(crate) fn from_word(word: u64) -> Option<Signature> {
        Some(Signature {
            count: word >> 8,
            dtype: Dtype::from_code(word & 0xff)?,
        })
    }
}

/// The calls grouped by what they passed, in order of first rank: "rank 0 passed 10 f32,
/// ranks 1-3 and 5 passed 1000 f32, rank 4 passed 1000 f16".
pub fn describe_calls(calls: &[Signature]) -> String {
    let mut groups: Vec<(Signature, Vec<usize>)> = Vec::new();
    for (rank, call) in calls.iter().enumerate() {
        match groups.iter_mut().find(|(c, _)| c == call) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((*call, vec![rank])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(call, ranks)| {
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!(
                "{noun} {} passed {} {}",
                rank_list(ranks),
                call.count,
                call.dtype.name()
            )
        })
        .collect();
    parts.join(", ")
}

/// Ascending ranks, runs of three or more as ranges: "0-3, 5, 6 and 9".
fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            runs.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            runs.extend(ranks[i..=j].iter().map(ToString::to_string));
        }
        i = j + 1;
    }
    match runs.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => runs.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_zero_is_no_signature() {
        let s = Signature::new(Dtype::Bf16, 300_000);
        assert_eq!(Signature::from_word(s.to_word()), Some(s));
        assert_eq!(Signature::from_word(0), None);
    }

    #[test]
    fn describes_groups_of_ranks() {
        let a = Signature::new(Dtype::F32, 10);
        let b = Signature::new(Dtype::F32, 1000);
        let c = Signature::new(Dtype::F16, 1000);
        let text = describe_calls(&[a, b, b, b, c, b, a]);
        assert_eq!(
            text,
            "ranks 0 and 6 passed 10 f32, ranks 1-3 and 5 passed 1000 f32, rank 4 passed 1000 f16"
        );
    }
}
