//! Class numbers named by wnids, for inputs that label each image by a number (a WebDataset
//! sample's `.cls`, a TFRecord's `label`) rather than by a wnid. A number's wnid comes from a
//! list when there is one (line k: class k), or else from the inputs that state their wnid (a
//! key or file name `n01440764_10026`, a TFRecord's synset). Every stated wnid must agree: a
//! number given two wnids, a wnid given two numbers, a number beyond the list or with no wnid
//! are refused, naming the inputs (and the list's line).

use std::collections::BTreeMap;
use std::path::Path;

use super::listing::input_err;
use crate::error::Result;

/// One numbered input: its class number and the wnid it states, if any.
pub(super) struct Numbered<'a> {
    pub(super) class: u32,
    pub(super) wnid: Option<&'a str>,
}

/// A list that names the numbers: line k holds the wnid of class k.
pub(super) struct NumberList<'a> {
    /// Where it was read from.
    pub(super) path: &'a Path,
    pub(super) wnids: &'a [String],
}

/// The wnid each number is stated to have (every input stating its number's, and within the
/// list when there is one); `field` names the number in errors (`.cls`), `at(i)` input `i`.
pub(super) fn stated<'a>(
    inputs: &[Numbered<'a>],
    list: Option<&NumberList>,
    field: &str,
    at: impl Fn(usize) -> String,
) -> Result<BTreeMap<u32, &'a str>> {
    let mut of_class: BTreeMap<u32, (&str, usize)> = BTreeMap::new();
    let mut class_of: BTreeMap<&str, (u32, usize)> = BTreeMap::new();
    for (i, n) in inputs.iter().enumerate() {
        let class = n.class;
        if let Some(list) = list {
            let listed = list.wnids.get(class as usize);
            let why = match (listed, n.wnid) {
                (None, _) => format!(
                    "has {field} {class}, beyond the {} classes of {}",
                    list.wnids.len(),
                    list.path.display()
                ),
                (Some(w), Some(wnid)) if w != wnid => format!(
                    "states {wnid}, but its {field} {class} is {w} by line {} of {}",
                    class + 1,
                    list.path.display()
                ),
                _ => continue,
            };
            return Err(input_err(Path::new(&at(i)), why));
        }
        let Some(wnid) = n.wnid else { continue };
        let (w, first) = *of_class.entry(class).or_insert((wnid, i));
        if w != wnid {
            return Err(input_err(
                Path::new(&at(i)),
                format!(
                    "states {wnid}, with {field} {class}, but {} states {w} with {field} {class}",
                    at(first)
                ),
            ));
        }
        let (c, first) = *class_of.entry(wnid).or_insert((class, i));
        if c != class {
            return Err(input_err(
                Path::new(&at(i)),
                format!(
                    "states {wnid}, with {field} {class}, but {} states {wnid} with {field} {c}",
                    at(first)
                ),
            ));
        }
    }
    Ok(of_class.into_iter().map(|(c, (w, _))| (c, w)).collect())
}

/// Each class number's wnid, index the number: the list's, or else the wnids the inputs state
/// ([`stated`]), where every number from 0 to the largest must have one.
pub(super) fn name_numbers(
    inputs: &[Numbered],
    list: Option<&NumberList>,
    field: &str,
    at: impl Fn(usize) -> String,
) -> Result<Vec<String>> {
    let named = stated(inputs, list, field, &at)?;
    if let Some(list) = list {
        return Ok(list.wnids.to_vec());
    }
    let count = inputs
        .iter()
        .map(|n| n.class as usize + 1)
        .max()
        .unwrap_or(0);
    (0..count as u32)
        .map(|c| match named.get(&c) {
            Some(w) => Ok(w.to_string()),
            None => {
                let example = inputs.iter().position(|n| n.class == c).map(&at);
                Err(input_err(
                    Path::new(&example.unwrap_or_else(|| "the inputs".into())),
                    format!(
                        "class {c} has no wnid: no input of it states its synset (a name like \
                         n01440764_10026){}; give the class list (line k: the wnid of class k)",
                        if c as usize + 1 == count {
                            ""
                        } else {
                            ", or no input has it"
                        }
                    ),
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(class: u32, wnid: Option<&str>) -> Numbered<'_> {
        Numbered { class, wnid }
    }

    #[test]
    fn numbers_are_named_by_what_the_inputs_state() {
        let at = |i: usize| format!("input{i}");
        let ok = [n(1, Some("n2")), n(0, Some("n1")), n(1, None)];
        assert_eq!(name_numbers(&ok, None, "label", at).unwrap(), ["n1", "n2"]);
        let two = [n(0, Some("n1")), n(0, Some("n2"))];
        let e = name_numbers(&two, None, "label", at)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("input1") && e.contains("input0 states n1"),
            "{e}"
        );
        let twice = [n(0, Some("n1")), n(1, Some("n1"))];
        assert!(name_numbers(&twice, None, "label", at).is_err());
        let gap = [n(1, Some("n2"))];
        let e = name_numbers(&gap, None, "label", at)
            .unwrap_err()
            .to_string();
        assert!(e.contains("class 0 has no wnid"), "{e}");
        let wnids = ["n1".to_string(), "n2".to_string()];
        let list = NumberList {
            path: Path::new("labels.txt"),
            wnids: &wnids,
        };
        let named = name_numbers(&[n(1, None)], Some(&list), "label", at).unwrap();
        assert_eq!(named, wnids);
        let e = name_numbers(&[n(1, Some("n1"))], Some(&list), "label", at);
        assert!(e.unwrap_err().to_string().contains("line 2 of labels.txt"));
        let e = name_numbers(&[n(2, None)], Some(&list), "label", at);
        assert!(e.unwrap_err().to_string().contains("beyond the 2 classes"));
    }
}
