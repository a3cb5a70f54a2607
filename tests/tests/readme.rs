//! Every ddl command the README and the guides in docs/ show runs as pasted: each one (in code
//! blocks, and inline ones that are whole commands) is run in an empty scratch directory, where the ones that
//! read data stop at its absence and the others (`ddl-plan`, `ddl-bench sim`, `ddl-synth`)
//! do their work. None may be refused by its command line (exit status 2: a missing required
//! flag, an unknown one, a bad value). Fragments mark themselves: a placeholder in capitals
//! (`ddl-pack -o DIR`), alternatives (`allreduce|calibrate`) or `...`. Under `mpirun` the
//! binary runs alone: the launcher's flags are not ddl's.

use std::path::Path;

use ddl_tests::{command, printed, run, scratch};

/// The guides a user pastes commands from: the workspace's README, then docs/'s guides. Not
/// TROUBLESHOOTING.md, whose cases are commands refused on purpose, nor DESIGN.md.
const GUIDES: [&str; 9] = [
    "README.md",
    "docs/PACK.md",
    "docs/TRAIN.md",
    "docs/MEASURE.md",
    "docs/PYTORCH.md",
    "docs/MODELS.md",
    "docs/CLUSTERS.md",
    "docs/GPU.md",
    "docs/SECURITY.md",
];

/// The README and the guides, one after the other.
fn readme() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    GUIDES
        .iter()
        .map(|guide| {
            let path = root.join(guide);
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines of the README's code blocks other than Python, comments cut and `\`
/// continuations joined, and its inline code spans, blanks collapsed.
fn shown_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut block: Option<bool> = None; // Some(is_python) inside a code block
    let mut pending = String::new();
    let mut prose = String::new();
    for line in text.lines() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None => Some(lang.starts_with("python")),
            };
            continue;
        }
        match block {
            Some(false) => {
                let code = line.split(" #").next().unwrap_or("").trim_end();
                match code.strip_suffix('\\') {
                    Some(head) => pending.push_str(head),
                    None => {
                        pending.push_str(code);
                        commands.push(std::mem::take(&mut pending));
                    }
                }
            }
            Some(true) => {}
            None => {
                prose.push_str(line);
                prose.push(' ');
            }
        }
    }
    commands.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
    commands
        .iter()
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The ddl binary and its arguments of a shown command, `mpirun` and its flags dropped;
/// None for another program, a bare name or a fragment.
fn ddl_command(shown: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = shown.split(' ').collect();
    let start = if words.first() == Some(&"mpirun") {
        words.iter().position(|w| w.starts_with("ddl-"))?
    } else {
        0
    };
    let command = &words[start..];
    let fragment = |w: &&str| {
        w.contains('|')
            || w.contains("...")
            || (w.chars().any(|c| c.is_ascii_uppercase())
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || "_.".contains(c)))
    };
    let is_ddl = command.first()?.starts_with("ddl-");
    (is_ddl && command.len() > 1 && !command.iter().any(fragment)).then(|| command.to_vec())
}

#[test]
fn every_command_the_readme_and_guides_show_runs_as_pasted() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    for entry in std::fs::read_dir(&docs).unwrap() {
        let name = format!("docs/{}", entry.unwrap().file_name().to_string_lossy());
        let checked = GUIDES.contains(&name.as_str());
        let exempt = ["docs/DESIGN.md", "docs/TROUBLESHOOTING.md"].contains(&name.as_str());
        assert!(
            checked || exempt,
            "{name} is not among the guides checked here"
        );
    }
    let shown = shown_commands(&readme());
    let commands: Vec<Vec<&str>> = shown.iter().filter_map(|s| ddl_command(s)).collect();
    // The guides' own examples, so that a change of the parser cannot pass by finding none.
    for expected in [
        "ddl-bench sim --model resnet101 --classes 21841",
        "ddl-pack imagenet/ -o shards/ --shards 1024 --nodes 64",
        "ddl-predict --model resnet50.safetensors photo.jpg photos/",
    ] {
        assert!(
            commands.iter().any(|c| c.join(" ") == expected),
            "{expected:?} not found among {commands:?}"
        );
    }
    let mut refused = Vec::new();
    for words in &commands {
        let tmp = scratch("readme");
        let out = run(command(words[0]).args(&words[1..]).current_dir(tmp.path()));
        if out.status.code() == Some(2) {
            refused.push(format!("{}: {}", words.join(" "), printed(&out)));
        }
    }
    assert!(refused.is_empty(), "{}", refused.join("\n\n"));
}

/// The guides' runnable `ddl-plan --exchange` example (with `--records`, docs/MEASURE.md)
/// prints what the guide says it does: into each of the first `1 / Q` epochs `Q N (P - 1) / P` records over
/// all nodes, `Q N ((P - 1) / P)^2` later, each boundary within the link's spare time of
/// `--epoch-s`, and the run's total over its boundaries.
#[test]
fn the_readmes_exchange_plan_prints_the_exchange_it_describes() {
    let shown = shown_commands(&readme());
    let words = shown
        .iter()
        .filter_map(|s| ddl_command(s))
        .find(|c| c[0] == "ddl-plan" && c.contains(&"--exchange") && c.contains(&"--records"))
        .expect("a guide shows `ddl-plan --exchange Q --records N ...`");
    let flag = |name: &str| -> f64 {
        let at = words.iter().position(|w| *w == name).expect(name);
        words[at + 1].parse().expect(name)
    };
    let (q, p, n) = (flag("--exchange"), flag("--nodes"), flag("--records"));
    let tmp = scratch("readme-plan");
    let out = run(command("ddl-plan")
        .args(&words[1..])
        .current_dir(tmp.path()));
    assert!(out.status.success(), "{}", printed(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("# exchange: Q {q} over {p} nodes, {n} records")),
        "{text}"
    );
    let table = &text[text.find("# exchange:").unwrap_or(0)..];
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| !l.starts_with('#') && l.trim() != "..." && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .filter(|w: &Vec<&str>| w[0].parse::<u64>().is_ok())
        .collect();
    let away = (p - 1.0) / p;
    let (first, last) = (&rows[0], &rows[rows.len() - 1]);
    assert_eq!(first[..2], ["1", &format!("{:.0}", q * n * away)], "{text}");
    assert_eq!(
        last[..2],
        ["89", &format!("{:.0}", q * n * away * away)],
        "{text}"
    );
    assert!(rows.iter().all(|r| r.last() == Some(&"yes")), "{text}");
    assert!(text.contains("# the run's 89 boundaries:"), "{text}");
}
