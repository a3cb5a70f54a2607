//! Why the packer refuses an output directory ([`OutputConflict`]), in values and in words;
//! `output.rs` finds it.

use super::spec::PackSpec;

/// How many names an error or a report line shows before "and N more".
const SHOWN_NAMES: usize = 5;

/// `a, b, c and 4 more`.
fn show(names: &[String]) -> String {
    let mut s = names
        .iter()
        .take(SHOWN_NAMES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN_NAMES {
        s.push_str(&format!(" and {} more", names.len() - SHOWN_NAMES));
    }
    s
}

/// Who packed the other ddl pack found in an output directory, as far as its state says.
#[derive(Clone, Debug, PartialEq)]
pub enum PackedBy {
    /// A state of identity v2: its option values.
    Options(PackSpec),
    /// A state of identity v1: its flags in words, as that build wrote them.
    Words(String),
    /// A state that records neither (an older state layout).
    OlderPacker,
}

/// What an output directory holds besides this pack's files.
#[derive(Clone, Debug, PartialEq)]
pub struct Occupant {
    /// Files of another ddl pack.
    pub other_pack: Vec<String>,
    /// Classes and shards of the manifest found, if one parses.
    pub manifest: Option<(usize, usize)>,
    /// Who packed them, if a state of another pack was found.
    pub packed_by: Option<PackedBy>,
    /// Files ddl-pack did not write.
    pub unrelated: Vec<String>,
}

impl Occupant {
    /// In words, writing a pack's options with `spec` (library words or a command line's flags).
    pub fn describe(&self, spec: &dyn Fn(&PackSpec) -> String) -> String {
        let mut parts = Vec::new();
        if !self.other_pack.is_empty() {
            let mut s = String::from("another ddl dataset");
            if let Some((classes, shards)) = self.manifest {
                s.push_str(&format!(
                    " (manifest.json: {classes} classes, {shards} shards)"
                ));
            }
            match &self.packed_by {
                Some(PackedBy::Options(o)) => s.push_str(&format!(", packed from {}", spec(o))),
                Some(PackedBy::Words(w)) => s.push_str(&format!(", packed from {w}")),
                Some(PackedBy::OlderPacker) => s.push_str(", packed by an older ddl-pack"),
                None => {}
            }
            let n = self.other_pack.len();
            s.push_str(&format!(": {n} file(s): {}", show(&self.other_pack)));
            parts.push(s);
        }
        if !self.unrelated.is_empty() {
            parts.push(format!(
                "{} file(s) ddl-pack did not write: {}",
                self.unrelated.len(),
                show(&self.unrelated)
            ));
        }
        parts.join("; and ")
    }
}

/// Why the packer refuses an output directory (nothing was written or removed).
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConflict {
    /// A file ddl-pack cannot tell is its own stands where this pack writes: refused even when
    /// forced.
    InTheWay {
        /// Its name.
        name: String,
    },
    /// The directory holds another pack's files or unrelated files, and the pack was not
    /// forced.
    Occupied {
        /// What is there.
        occupant: Box<Occupant>,
        /// The pack that was refused.
        this_pack: Box<PackSpec>,
    },
}

impl OutputConflict {
    /// The refusal and what to do, writing a pack's options with `spec` and the way to force
    /// a pack as `force` (library words or a command line's flags).
    pub fn describe(&self, spec: &dyn Fn(&PackSpec) -> String, force: &str) -> String {
        match self {
            OutputConflict::InTheWay { name } => format!(
                "{name} is in the way: this pack writes that name, and ddl-pack cannot tell it \
                 is a file of its own: move it away or choose another output directory \
                 (ddl-pack never replaces a file it did not write, even with {force})"
            ),
            OutputConflict::Occupied {
                occupant,
                this_pack,
            } => format!(
                "holds {}: choose an empty or new output directory, or pass {force} to replace \
                 the files of the other ddl pack that this pack writes ({}); files ddl-pack \
                 did not write are never touched",
                occupant.describe(spec),
                spec(this_pack)
            ),
        }
    }
}
