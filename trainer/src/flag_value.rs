//! How a value of a setting's type is typed on a command line ([`FlagValue`]): parsed,
//! checked, shown as a default and listed as choices; here for the plain types and those of
//! the other ddl crates, for the library's own types beside each type. A leaf: the types that
//! implement it import it without a circle.

use std::fmt::Display;
use std::path::PathBuf;

use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::OnBadRecord;

/// How a flag takes its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// No value: the flag turns its setting from its default to the other boolean.
    Switch,
    /// One value.
    One,
    /// Comma-separated values (`30,60,80`), also over several occurrences.
    List,
    /// One value per occurrence, the flag repeated for more.
    Repeated,
}

/// One value a setting may take by name, with what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The name as typed.
    pub name: &'static str,
    /// The name with the parameters it may take (`multicolor[:COLORS[:CHUNK_BYTES]]`; empty:
    /// the name alone).
    pub syntax: &'static str,
    /// One line on what it does (empty: none).
    pub help: &'static str,
}

impl Choice {
    /// A choice without parameters.
    pub const fn named(name: &'static str, help: &'static str) -> Choice {
        Choice {
            name,
            syntax: "",
            help,
        }
    }
}

/// A type a setting of a command line has: how its values are parsed from what the user typed,
/// checked one at a time, shown as a default, and named where they are a fixed list.
pub trait FlagValue: Sized {
    /// How a flag of this type takes its values.
    const TAKES: Takes = Takes::One;

    /// The value of the strings typed (one for [`Takes::One`], `"true"` or `"false"` for a
    /// switch, each piece of a list), or what is wrong with them.
    fn parse_flag(values: &[&str]) -> Result<Self, String>;

    /// Whether one string typed (one piece of a list) can be a value: a usage error at once.
    fn check_one(value: &str) -> Result<(), String> {
        Self::parse_flag(&[value]).map(drop)
    }

    /// The value as typed, for `[default: ...]`; `None` where there is nothing to show.
    fn shown(&self) -> Option<String>;

    /// The names it may take, where those are a fixed list (with parameters after `:` for
    /// some, as the parser says).
    fn choices() -> Vec<Choice> {
        Vec::new()
    }
}

/// The value of `values`, which must be one string, with `T`'s own parser.
pub(crate) fn parse_one<T: std::str::FromStr>(values: &[&str]) -> Result<T, String>
where
    T::Err: Display,
{
    match values {
        [one] => one.trim().parse().map_err(|e: T::Err| e.to_string()),
        _ => Err(format!("takes one value, got {}", values.len())),
    }
}

/// [`FlagValue`] for types parsed by their `FromStr` and shown by their `Display`, with the
/// names of their choices where they have a list.
macro_rules! flag_value_from_str {
    ($($ty:ty $(=> $choices:expr)?),* $(,)?) => {$(
        impl $crate::flag_value::FlagValue for $ty {
            fn parse_flag(values: &[&str]) -> Result<Self, String> {
                $crate::flag_value::parse_one(values)
            }
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
            $(fn choices() -> Vec<$crate::flag_value::Choice> {
                $choices
                    .iter()
                    .map(|&name| $crate::flag_value::Choice::named(name, ""))
                    .collect()
            })?
        }
    )*};
}

pub(crate) use flag_value_from_str;

flag_value_from_str!(u32, u64, usize, f32, f64, String);

impl FlagValue for bool {
    const TAKES: Takes = Takes::Switch;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    /// `true` or `false`: which of the two a switch turns the setting from.
    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl FlagValue for PathBuf {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        let empty = self.as_os_str().is_empty();
        (!empty).then(|| self.display().to_string())
    }
}

impl<T: FlagValue> FlagValue for Option<T> {
    const TAKES: Takes = T::TAKES;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        T::parse_flag(values).map(Some)
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        self.as_ref().and_then(T::shown)
    }

    fn choices() -> Vec<Choice> {
        T::choices()
    }
}

impl<T: FlagValue> FlagValue for Vec<T> {
    const TAKES: Takes = Takes::List;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        values.iter().map(|v| T::parse_flag(&[v])).collect()
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        let shown: Option<Vec<String>> = self.iter().map(T::shown).collect();
        shown.filter(|s| !s.is_empty()).map(|s| s.join(","))
    }
}

impl<T: FlagValue, const N: usize> FlagValue for [T; N] {
    const TAKES: Takes = Takes::List;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        let n = values.len();
        let parsed = Vec::<T>::parse_flag(values)?;
        parsed
            .try_into()
            .map_err(|_| format!("takes {N} comma-separated values, got {n}"))
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        let shown: Option<Vec<String>> = self.iter().map(T::shown).collect();
        shown.map(|s| s.join(","))
    }
}

/// A type whose values are a fixed list of names: what [`FlagValue`] needs of it.
pub trait Named: Copy + 'static {
    /// Every value, in the order the help lists them.
    const ALL: &'static [Self];
    /// The name as typed.
    fn name(self) -> &'static str;
    /// One line on what it does (empty: none).
    fn help(self) -> &'static str {
        ""
    }

    /// The value named `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}

/// [`FlagValue`] for [`Named`] types.
macro_rules! flag_value_named {
    ($($ty:ty),* $(,)?) => {$(
        impl $crate::flag_value::FlagValue for $ty {
            fn parse_flag(values: &[&str]) -> Result<Self, String> {
                use $crate::flag_value::Named;
                let [one] = values else {
                    return Err(format!("takes one value, got {}", values.len()));
                };
                <$ty as Named>::from_name(one.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                    format!("{one:?} is not one of {}", names.join(", "))
                })
            }
            fn shown(&self) -> Option<String> {
                Some($crate::flag_value::Named::name(*self).to_string())
            }
            fn choices() -> Vec<$crate::flag_value::Choice> {
                use $crate::flag_value::{Choice, Named};
                Self::ALL.iter().map(|v| Choice::named(v.name(), v.help())).collect()
            }
        }
    )*};
}

pub(crate) use flag_value_named;

flag_value_from_str!(
    ShardAlgorithm => ShardAlgorithm::NAMES,
    CommOrder => CommOrder::NAMES,
);

/// `allreduce`: the algorithms of comm's registry, with their parameters and help.
impl FlagValue for Algorithm {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }

    fn choices() -> Vec<Choice> {
        let choice = |d: &ddl_comm::allreduce::Declared| Choice {
            name: d.name,
            syntax: d.syntax,
            help: d.help,
        };
        Algorithm::DECLARED.iter().map(choice).collect()
    }
}

flag_value_named!(OnBadRecord);

impl Named for OnBadRecord {
    const ALL: &'static [Self] = &[OnBadRecord::Replace, OnBadRecord::Skip, OnBadRecord::Fail];

    fn name(self) -> &'static str {
        match self {
            OnBadRecord::Replace => "replace",
            OnBadRecord::Skip => "skip",
            OnBadRecord::Fail => "fail",
        }
    }

    fn help(self) -> &'static str {
        match self {
            OnBadRecord::Replace => "with the next good record of the epoch",
            OnBadRecord::Skip => "leave it out: a shorter batch",
            OnBadRecord::Fail => "stop the run",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_check_each_piece_and_count_the_whole() {
        assert_eq!(<[f64; 2]>::parse_flag(&["0.1", "1"]), Ok([0.1, 1.0]));
        let three = <[f64; 2]>::parse_flag(&["0.1", "0.2", "1"]).unwrap_err();
        assert_eq!(three, "takes 2 comma-separated values, got 3");
        assert!(<[f64; 2]>::check_one("x").is_err());
        assert_eq!(vec![30u32, 60].shown().as_deref(), Some("30,60"));
    }
}
