//! How a user types each argument of a clap command line, read from clap's own definition of
//! it: a library names its settings, and a binary whose argument ids are those names spells
//! them in its messages as the flags its user types, without a second list to keep in step
//! with the first.

use std::collections::BTreeMap;

/// The flag of each named argument of `command`, by argument id (a derived `Parser`'s field
/// name): its short form if it has one (`-o`, as users type it), else its long one
/// (`--no-eval`). Positional arguments have no flag and are left out.
pub fn flags(command: &clap::Command) -> BTreeMap<String, String> {
    command
        .get_arguments()
        .filter_map(|a| {
            let flag = match (a.get_short(), a.get_long()) {
                (Some(short), _) => format!("-{short}"),
                (None, Some(long)) => format!("--{long}"),
                (None, None) => return None,
            };
            Some((a.get_id().to_string(), flag))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, CommandFactory, Parser};

    #[derive(Parser)]
    struct Args {
        input: String,
        #[arg(short, long)]
        output: String,
        #[arg(long)]
        image_size: u32,
        #[arg(long = "no-eval", action = ArgAction::SetFalse)]
        eval: bool,
    }

    #[test]
    fn each_argument_is_spelled_as_typed() {
        let flags = flags(&Args::command());
        let get = |id: &str| flags.get(id).map(String::as_str);
        assert_eq!(get("output"), Some("-o"));
        assert_eq!(get("image_size"), Some("--image-size"));
        assert_eq!(get("eval"), Some("--no-eval"));
        assert_eq!(get("input"), None, "a positional argument has no flag");
    }
}
