//! An error as one line: its causes each once, and the control characters of names that come
//! from outside escaped.

use crate::launcher::rank_prefix;

/// `text` with its control characters escaped as JSON escapes them (`\n`, `\t`, `\u001b`...):
/// for names that come from outside (file names, archive members) on the way to a terminal,
/// where a newline would forge a line of output and an escape sequence would act on the
/// terminal. Text without control characters is returned as it is.
///
/// # Examples
///
/// ```
/// use ddl_cli::escape_controls;
/// assert_eq!(escape_controls("n01/a.JPEG"), "n01/a.JPEG");
/// assert_eq!(escape_controls("a\nb\u{1b}[2J"), "a\\nb\\u001b[2J");
/// ```
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `e` and its causes joined by ": ", leaving out a cause whose text the line already ends
/// with: the errors of ddl's libraries include their cause in their own message (so that
/// `to_string()` alone says everything) and also return it as their `source()`, and printing
/// the whole chain wrote "Permission denied (os error 13): Permission denied (os error 13)".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// The line `[rank N: ]TOOL: error: CONTEXT: CAUSE: ...` (the whole chain on one line, its
/// control characters escaped: an error names files whose names come from outside), with its
/// newline.
pub fn error_line(tool: &str, e: &anyhow::Error) -> String {
    let chain = error_chain(&**e);
    let chain = escape_controls(&chain);
    format!("{}{tool}: error: {chain}\n", rank_prefix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("read {path}: {source}")]
    struct Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("packing")]
    struct Packing(#[source] Read);

    #[test]
    fn each_cause_is_written_once() {
        let denied = || std::io::Error::from_raw_os_error(13);
        let e = Packing(Read {
            path: "/x",
            source: denied(),
        });
        assert_eq!(error_chain(&e), format!("packing: read /x: {}", denied()));
    }

    #[test]
    fn error_line_holds_the_whole_chain_on_one_line() {
        let e = anyhow::anyhow!("disk full").context("write /x/manifest.json");
        let line = error_line("ddl-pack", &e);
        assert!(
            line.ends_with("ddl-pack: error: write /x/manifest.json: disk full\n"),
            "{line:?}"
        );
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    }
}
