//! Which classes a pack keeps, in which label order: every class found (sorted by wnid, or by
//! number when every class is named by a number, as ImageNetV2's folders `0` to `999` are), or
//! the class list's order ([`super::PackOptions::classes`]); then a minimum per class drops
//! those with fewer than N usable inputs. A class found with no usable training input at all (an empty
//! folder, a class only in val) is an error unless the caller keeps it as a class without
//! records or drops it by a minimum: left out silently, it would relabel every later class.
//!
//! "Usable" is counted when the classes are chosen, before anything is decoded: the inputs of
//! the class in the split the classes come from (the training split, or the validation split
//! of an input without one), that is, its files or tar members with an image file name. A
//! member that later fails to decode still counts (labels must be fixed before the first shard
//! is written, so that a resumed pack plans the same shards). With a held-out split
//! ([`super::PackOptions::val_split`]) the count is taken before the split is carved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::option_error::{OptionError, PackOption};
use crate::error::{LoaderError, Result};

/// The classes kept, in label order, and those the minimum per class dropped.
#[derive(Debug, Default)]
pub(crate) struct Selection {
    /// Kept wnids in label order.
    pub classes: Vec<String>,
    /// Dropped wnids with their usable input counts.
    pub dropped: BTreeMap<String, u64>,
}

/// Checks a class list read from `path`: not empty, no wnid twice.
pub(crate) fn check_list(path: &Path, list: &[String]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for w in list {
        if !seen.insert(w) {
            return Err(LoaderError::Input {
                path: path.to_path_buf(),
                reason: format!("class {w} is listed twice"),
            });
        }
    }
    if list.is_empty() {
        return Err(LoaderError::Input {
            path: path.to_path_buf(),
            reason: "lists no classes".into(),
        });
    }
    Ok(())
}

/// Fails with [`LoaderError::EmptyClasses`] when a class of `counts` (usable inputs by
/// wnid) has none: without it every later class would get another label (and its val images
/// would be dropped), unlike torchvision's ImageFolder, which refuses such a tree.
pub(crate) fn check_none_empty(input: &Path, counts: &BTreeMap<String, u64>) -> Result<()> {
    let empty: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(w, _)| w.clone())
        .collect();
    if empty.is_empty() {
        return Ok(());
    }
    Err(LoaderError::EmptyClasses {
        input: input.to_path_buf(),
        classes: empty,
    })
}

/// Chooses the classes: `listed` (the class list) in its order, or else every wnid of
/// `counts` in [`found_order`]; then drops those with fewer than `min` usable inputs (`counts`:
/// usable inputs by wnid). Fails, naming `input` and the option, when no class is left.
pub(crate) fn select(
    input: &Path,
    listed: Option<Vec<String>>,
    counts: &BTreeMap<String, u64>,
    min: u64,
) -> Result<Selection> {
    let candidates = listed.unwrap_or_else(|| found_order(counts.keys().cloned().collect()));
    let mut sel = Selection::default();
    for w in candidates {
        let n = counts.get(&w).copied().unwrap_or(0);
        if n < min {
            sel.dropped.insert(w, n);
        } else {
            sel.classes.push(w);
        }
    }
    if sel.classes.is_empty() {
        return Err(LoaderError::Option {
            path: input.to_path_buf(),
            source: OptionError::new(
                PackOption::MinPerClass,
                min,
                format!(
                    "drops every class: the largest has {} usable inputs",
                    counts.values().max().copied().unwrap_or(0)
                ),
            ),
        });
    }
    Ok(sel)
}

/// The label order of the classes found, `sorted` by name: by number when every name is one
/// (ImageNetV2's folders `0` to `999`, whose folder k holds class k: sorted as strings, `10`
/// would come before `2`), else as sorted (torchvision's order of wnids).
fn found_order(mut sorted: Vec<String>) -> Vec<String> {
    let number = |name: &str| -> Option<u128> {
        (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.parse().ok())?
    };
    if sorted.iter().all(|name| number(name).is_some()) {
        sorted.sort_by_key(|name| number(name));
    }
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_named_by_numbers_are_in_their_order() {
        let names = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
        let counts = |v: &[&str]| -> BTreeMap<String, u64> {
            v.iter().map(|s| (s.to_string(), 1)).collect()
        };
        let p = Path::new("in");
        let numbers = counts(&["0", "1", "2", "10", "11", "100", "007"]);
        let s = select(p, None, &numbers, 0).unwrap();
        assert_eq!(s.classes, names(&["0", "1", "2", "007", "10", "11", "100"]));
        let mixed = counts(&["10", "2", "n01440764"]);
        let s = select(p, None, &mixed, 0).unwrap();
        assert_eq!(s.classes, names(&["10", "2", "n01440764"]));
    }

    #[test]
    fn min_per_class_drops_small_classes_and_keeps_the_order() {
        let counts: BTreeMap<String, u64> = [("a", 5), ("b", 2), ("c", 9)]
            .into_iter()
            .map(|(w, n)| (w.to_string(), n))
            .collect();
        let p = Path::new("in");
        let s = select(p, None, &counts, 3).unwrap();
        assert_eq!(s.classes, ["a", "c"]);
        assert_eq!(s.dropped, BTreeMap::from([("b".to_string(), 2)]));
        let listed = vec!["c".to_string(), "z".into(), "b".into(), "a".into()];
        let s = select(p, Some(listed), &counts, 1).unwrap();
        assert_eq!(s.classes, ["c", "b", "a"]);
        assert_eq!(s.dropped, BTreeMap::from([("z".to_string(), 0)]));
        let e = select(p, None, &counts, 10).unwrap_err();
        let LoaderError::Option { source, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(source.option, PackOption::MinPerClass);
        assert_eq!(source.value.as_deref(), Some("10"));
        assert!(source.problem.contains('9'), "{e}");
    }
}
