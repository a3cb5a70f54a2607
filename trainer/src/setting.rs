//! The shape of the one table of settings ([`settings!`], invoked in config.rs): each row a
//! field of [`crate::TrainConfig`] that becomes its default, its [`crate::config::Setting`]
//! (what errors and messages name, spelled as the flag the user typed: `--no-eval`, `-o`), its
//! [`ResumeClass`] and its flag ([`crate::flag::Flag`]). Below the table: nothing here names
//! what it makes.

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
    /// Why, as the messages say it (settings in backquotes, see [`crate::config::spell`]).
    pub why: &'static str,
}

/// The one table of the configuration's settings (invoked in config.rs): each row, a field of
/// [`crate::TrainConfig`] with its doc, type, default and [`OnResume`] class, gives the field,
/// its value in `Default`, its [`crate::config::Setting`] and its class, so that none of them
/// is a list kept in step with another by hand. `others` are settings of `predict` and
/// `export` that are no field; `not_settings` are fields that are not settings (no flag, not
/// serialized).
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
            pub fn flag(self) -> Option<$crate::flag::Flag<Setting>> {
                use $crate::flag::{Flag, Heading};
                match self {
                    $(Setting::$variant => Some(Flag {
                        $($fkey: $fval,)*
                        ..Flag::of::<$ty>(
                            self,
                            stringify!($field),
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
            /// [`crate::flag_value::FlagValue::parse_flag`]), or says what is wrong with them
            /// (the caller names the flag: [`crate::TrainError::config`]).
            pub fn set_flag(
                &mut self,
                setting: Setting,
                values: &[&str],
            ) -> std::result::Result<(), String> {
                use $crate::flag_value::FlagValue;
                match setting {
                    $(Setting::$variant => {
                        self.$field = <$ty as FlagValue>::parse_flag(values)?;
                    })*
                    $(Setting::$ovariant => {
                        return Err("is not a setting of a training run".to_string());
                    })*
                }
                Ok(())
            }
        }
    };
}
pub(crate) use settings;
