//! The settings a library error or message can name: one per [`crate::TrainConfig`] field,
//! plus the few of `predict` and `export`, all from the one table in config.rs ([`settings!`]),
//! which also gives each field its default, its [`ResumeClass`] and its flag
//! ([`crate::flag::Flag`]). A message names a setting as its flag, as the user of the binaries
//! typed it (`--no-eval`, `-o`).

use std::fmt;

pub use crate::config::Setting;

/// What a different value of a setting does to a run resumed from a checkpoint written with
/// another (see [`crate::run_flags`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeClass {
    /// A different value computes different weights from the same checkpoint, so continuing
    /// would silently mix two runs: refused, naming the setting with both values.
    Trajectory,
    /// The same mathematics in another order: the weights differ only by rounding, so the run
    /// continues with a warning that it is no longer bitwise reproducible.
    Rounding,
    /// No effect on the weights (how long to run, where to write what, how to load).
    Free,
}

/// A setting's [`ResumeClass`] and why it is in it (the reason a refusal or warning gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnResume {
    /// What a different value does to a resumed run.
    pub class: ResumeClass,
    /// Why, as the messages say it (settings in backquotes, see [`spell`]).
    pub why: &'static str,
}

/// The one table of the configuration's settings (invoked in config.rs): each row, a field of
/// [`crate::TrainConfig`] with its doc, type, default and [`OnResume`] class, gives the field,
/// its value in `Default`, its [`Setting`] and its class, so that none of them is a list kept
/// in step with another by hand. `others` are settings of `predict` and `export` that are no
/// field; `not_settings` are fields that are not settings (no flag, not serialized).
macro_rules! settings {
    (
        $(#[$struct_meta:meta])*
        pub struct TrainConfig {
            $(
                $(#[doc = $doc:literal])*
                #[flag($heading:ident $(, $fkey:ident = $fval:expr)* $(,)?)]
                $(#[serde($($serde:tt)*)])*
                $variant:ident $field:ident: $ty:ty = $default:expr
                    => $class:ident($why:literal),
            )*
        }
        not_settings {
            $($(#[$nmeta:meta])* $nfield:ident: $nty:ty = $ndefault:expr,)*
        }
        others {
            $($(#[doc = $odoc:literal])* $ovariant:ident $oname:ident = $ospelled:literal,)*
        }
    ) => {
        $(#[$struct_meta])*
        pub struct TrainConfig {
            $($(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: $ty,)*
            $($(#[$nmeta])* pub $nfield: $nty,)*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                TrainConfig {
                    $($field: $default,)*
                    $($nfield: $ndefault,)*
                }
            }
        }

        /// A setting of the library, named in errors and messages: a field of
        /// [`TrainConfig`], or an argument of [`crate::predict`] or [`crate::export`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Setting {
            $($(#[doc = $doc])* $variant,)*
            $($(#[doc = $odoc])* $ovariant,)*
        }

        impl Setting {
            /// Every setting.
            pub const ALL: &'static [Setting] =
                &[$(Setting::$variant,)* $(Setting::$ovariant,)*];

            /// The settings of [`TrainConfig`]'s fields, in their order.
            pub const TRAIN: &'static [Setting] = &[$(Setting::$variant,)*];

            /// The setting's name: its field of [`TrainConfig`] (as serialized in a
            /// checkpoint's header) or its argument of [`crate::predict`] or
            /// [`crate::export`].
            pub fn name(self) -> &'static str {
                match self {
                    $(Setting::$variant => stringify!($field),)*
                    $(Setting::$ovariant => stringify!($oname),)*
                }
            }

            /// What a different value does to a resumed run, for a field of
            /// [`TrainConfig`]; `None` for the others.
            pub fn on_resume(self) -> Option<$crate::setting::OnResume> {
                use $crate::setting::{OnResume, ResumeClass};
                match self {
                    $(Setting::$variant => Some(OnResume {
                        class: ResumeClass::$class,
                        why: $why,
                    }),)*
                    $(Setting::$ovariant => None,)*
                }
            }

            /// How a user of `ddl-train` types the setting of a [`TrainConfig`] field (the
            /// doc of its row is the flag's help); `None` for the others.
            pub fn flag(self) -> Option<$crate::flag::Flag> {
                use $crate::flag::{Flag, Heading};
                match self {
                    $(Setting::$variant => Some(Flag {
                        $($fkey: $fval,)*
                        ..Flag::of::<$ty>(
                            self,
                            Heading::$heading,
                            concat!($($doc, "\n",)*),
                            &$default,
                        )
                    }),)*
                    $(Setting::$ovariant => None,)*
                }
            }

            /// How the setting is typed: its flag, or the flag of `predict` and `export`.
            pub(crate) fn spelled(self) -> String {
                match self {
                    $(Setting::$ovariant => $ospelled.to_string(),)*
                    _ => match self.flag() {
                        Some(f) => match f.short {
                            Some(short) => format!("-{short}"),
                            None => format!("--{}", f.long_name()),
                        },
                        None => format!("`{}`", self.name()),
                    },
                }
            }
        }

        impl TrainConfig {
            /// Sets the field of `setting` from the strings a user typed for its flag (see
            /// [`crate::flag_value::FlagValue::parse_flag`]); an error names the flag.
            pub fn set_flag(&mut self, setting: Setting, values: &[&str]) -> $crate::error::Result<()> {
                use $crate::flag_value::FlagValue;
                let bad = |e: String| $crate::error::TrainError::config(setting, e);
                match setting {
                    $(Setting::$variant => {
                        self.$field = <$ty as FlagValue>::parse_flag(values).map_err(bad)?;
                    })*
                    $(Setting::$ovariant => {
                        return Err(bad("is not a setting of a training run".to_string()));
                    })*
                }
                Ok(())
            }
        }
    };
}
pub(crate) use settings;

impl Setting {
    /// The setting named `name` ([`Setting::name`]).
    pub fn from_name(name: &str) -> Option<Setting> {
        Setting::ALL.iter().copied().find(|s| s.name() == name)
    }
}

impl fmt::Display for Setting {
    /// The setting as its user types it: its flag.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spelled())
    }
}

/// Several settings, as `a/b/c` (an error any of them can lift).
pub fn joined(settings: &[Setting]) -> String {
    settings
        .iter()
        .map(Setting::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings are spelled as the flags users type, overrides and `predict`'s included.
    #[test]
    fn settings_are_spelled_as_flags() {
        for (setting, flag) in [
            (Setting::Eval, "--no-eval"),
            (Setting::Verbose, "--quiet"),
            (Setting::Lock, "--mlock"),
            (Setting::CommTimeoutS, "--comm-timeout"),
            (Setting::AllowNewLayout, "--allow-new-layout"),
            (Setting::InductorOptions, "--inductor-option"),
            (Setting::Output, "-o"),
        ] {
            assert_eq!(setting.to_string(), flag);
        }
    }

    /// Every field of the configuration (as a checkpoint records it) is a setting a message
    /// can name, with its class on resume; the others have none.
    #[test]
    fn every_config_field_is_a_classified_setting() {
        let v = serde_json::to_value(crate::TrainConfig::default()).unwrap();
        let fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for field in &fields {
            let s = Setting::from_name(field);
            assert_eq!(s.map(Setting::name), Some(*field), "{field}");
            assert!(s.and_then(Setting::on_resume).is_some(), "{field}");
        }
        assert_eq!(Setting::TRAIN.len(), fields.len());
        for s in Setting::ALL.iter().filter(|s| !Setting::TRAIN.contains(s)) {
            assert_eq!(s.on_resume(), None, "{s:?}");
        }
    }
}
