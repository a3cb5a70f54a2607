#!/usr/bin/env bash
# `make lint`: every dependency the Python extension (which `maturin develop` builds alone)
# shares with the rest of the workspace must have the features that `cargo build --workspace
# --exclude ddl-python --all-targets` gives it; where they differ, the two builds compile that
# crate, and every crate above it, once each. python/Cargo.toml turns on what the rest does.
set -euo pipefail
cd "$(dirname "$0")/.."
resolved() {
    ${CARGO:-cargo} tree --locked --prefix none -f '{p} {f}' "$@" |
        sed -e 's/ (\*)$//' -e 's/ (proc-macro)//' | sort -u
}
alone=$(resolved -p ddl-python -e normal,build | grep -v '^ddl-python ')
rest=$(resolved --workspace --exclude ddl-python -e normal,build,dev)
# What ddl-python alone builds of what the rest builds too, and not as the rest builds it.
shared=$(awk 'NR == FNR { rest[$1 " " $2]; next } ($1 " " $2) in rest' <(echo "$rest") - <<< "$alone")
differ=$(comm -23 <(echo "$shared") <(echo "$rest"))
if [ -n "$differ" ]; then
    echo "same-features: ddl-python alone builds these dependencies with features the rest of" >&2
    echo "the workspace does not; match them in python/Cargo.toml (package, features):" >&2
    while read -r name version _; do
        echo "  ddl-python: $(grep "^$name $version " <<< "$differ")"
        grep "^$name $version " <<< "$rest" | sed 's/^/  the rest:   /'
    done <<< "$differ" >&2
    exit 1
fi
