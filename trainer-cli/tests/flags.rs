//! `ddl-train` checks its flags' values on the command line, and spells the settings the
//! library's errors name as its flags.

use crate::common::TRAIN;

/// Values that are not a model, a device list, an algorithm or another flag's choices are
/// refused by the command line, naming the flag, before MPI or the data are touched.
#[test]
fn flag_values_are_checked_by_the_command_line() {
    for (flag, value) in [
        ("--model", "vgg"),
        ("--devices", "gpu:7"),
        ("--devices", "cpu:0"),
        ("--allreduce", "tree"),
        ("--on-bad-record", "ignore"),
        ("--schedule", "linear"),
        ("--precision", "fp8"),
        ("--residency", "rack"),
        ("--overlap", "sometimes"),
    ] {
        let out = std::process::Command::new(TRAIN)
            .args(["--data", "/nonexistent", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag} {value}: {err}"
        );
    }
}

/// The library names settings; `ddl-train` spells them as its flags, both the setting an error
/// is about and the ones its message mentions, exactly as the user typed them.
#[test]
fn the_binary_names_its_flags_in_the_library_errors() {
    for (args, want) in [
        (
            &["--momentum", "1"][..],
            "invalid --momentum: 1 is outside [0, 1)",
        ),
        (
            &["--resume"][..],
            "invalid --resume: needs --checkpoint-dir",
        ),
    ] {
        let out = std::process::Command::new(TRAIN)
            .args(["--data", "/nonexistent"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
