//! The settings a library error or message can name: one per [`crate::TrainConfig`] field,
//! plus the few of `predict` and `export`. The library names a setting, never a command-line flag; a
//! binary installs, once, how its users spell each one ([`name_settings`]), so that its
//! messages name the flag the user typed.

use std::fmt;
use std::sync::OnceLock;

macro_rules! settings {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// A setting of the library, named in errors and messages.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Setting {
            $($(#[$doc])* $variant,)*
        }

        impl Setting {
            /// Every setting.
            pub const ALL: &'static [Setting] = &[$(Setting::$variant,)*];

            /// The setting's name: its field of [`crate::TrainConfig`] (as serialized in a
            /// checkpoint's header) or its argument of [`crate::predict`].
            pub fn name(self) -> &'static str {
                match self {
                    $(Setting::$variant => $name,)*
                }
            }
        }
    };
}

settings! {
    /// The shard directory.
    Data = "data",
    /// Train on a random batch without data.
    SyntheticData = "synthetic_data",
    /// Classes of the synthetic data's model.
    Classes = "classes",
    /// cuDNN's deterministic algorithms.
    Deterministic = "deterministic",
    /// The network.
    Model = "model",
    /// Epochs to train.
    Epochs = "epochs",
    /// Images per replica per step.
    Batch = "batch",
    /// The local devices of a training run.
    Devices = "devices",
    /// Input side in pixels.
    ImageSize = "image_size",
    /// Decode threads per rank.
    Workers = "workers",
    /// Ready batches queued per replica.
    Prefetch = "prefetch",
    /// Seed of weights, sampling and augmentation.
    Seed = "seed",
    /// Learning rate per 256 images.
    BaseLr = "base_lr",
    /// Peak learning rate.
    Lr = "lr",
    /// SGD momentum.
    Momentum = "momentum",
    /// Nesterov momentum.
    Nesterov = "nesterov",
    /// Weight decay.
    WeightDecay = "weight_decay",
    /// Warmup epochs.
    WarmupEpochs = "warmup_epochs",
    /// Learning-rate decay.
    Schedule = "schedule",
    /// Step-decay epochs.
    Milestones = "milestones",
    /// Step-decay factor.
    Gamma = "gamma",
    /// Label smoothing.
    LabelSmoothing = "label_smoothing",
    /// The step compiled ahead of time by Inductor.
    Compile = "compile",
    /// The compile cache.
    CompileCache = "compile_cache",
    /// Arithmetic of forward and backward.
    Precision = "precision",
    /// The metrics file.
    Metrics = "metrics",
    /// The record trace files.
    TraceRecords = "trace_records",
    /// The checkpoint directory.
    CheckpointDir = "checkpoint_dir",
    /// Checkpoint interval in global steps.
    CheckpointEvery = "checkpoint_every",
    /// Checkpoints kept.
    KeepCheckpoints = "keep_checkpoints",
    /// Continue from the newest checkpoint.
    Resume = "resume",
    /// Move another run's checkpoints aside.
    Restart = "restart",
    /// Resume on another layout.
    AllowNewLayout = "allow_new_layout",
    /// Stop after this many global steps.
    MaxSteps = "max_steps",
    /// Allreduce algorithm.
    Allreduce = "allreduce",
    /// Cost model file of `auto`.
    CostModel = "cost_model",
    /// Where the tuned cost model is written.
    SaveCostModel = "save_cost_model",
    /// The classifier head split by class.
    HeadParallel = "head_parallel",
    /// Allgather / reduce-scatter algorithm of the split head.
    Gather = "gather",
    /// Raw weights dump.
    DumpWeights = "dump_weights",
    /// The exported model file.
    Export = "export",
    /// The weights to start from.
    InitFrom = "init_from",
    /// Re-initialise the classifier head.
    ResetHead = "reset_head",
    /// Compare replica checksums.
    CheckReplicas = "check_replicas",
    /// How the ranks of a node share the dataset.
    Residency = "residency",
    /// Fraction of the train records nodes exchange each epoch.
    Exchange = "exchange",
    /// What the allreduce overlaps with.
    Overlap = "overlap",
    /// The order of the buckets on the communication thread.
    CommOrder = "comm_order",
    /// Gradient bucket size.
    BucketMb = "bucket_mb",
    /// Channels-last layout.
    ChannelsLast = "channels_last",
    /// Evaluation after every epoch.
    Eval = "eval",
    /// Shorter side before the eval center crop.
    EvalResize = "eval_resize",
    /// The eval resize as a multiple of the image size.
    EvalResizeRatio = "eval_resize_ratio",
    /// The train image size of each epoch.
    ImageSizeSchedule = "image_size_schedule",
    /// RandomResizedCrop's area fraction range.
    CropScale = "crop_scale",
    /// RandomResizedCrop's aspect ratio range.
    CropRatio = "crop_ratio",
    /// Probability of a horizontal flip.
    FlipProb = "flip_prob",
    /// Channel means of the normalisation.
    Mean = "mean",
    /// Channel standard deviations of the normalisation.
    Std = "std",
    /// Pre-fault the shards.
    Populate = "populate",
    /// mlock the shards.
    Lock = "lock",
    /// Node-local copy of the shards.
    Stage = "stage",
    /// Timeout of a communication operation.
    CommTimeoutS = "comm_timeout_s",
    /// What a bad record does.
    OnBadRecord = "on_bad_record",
    /// Per-epoch lines.
    Verbose = "verbose",
    /// The device of [`crate::predict`].
    Device = "device",
    /// The architecture of a state dict without ddl metadata ([`crate::predict`]).
    Arch = "arch",
    /// The file [`crate::export`] writes.
    Output = "output",
}

impl Setting {
    /// The setting named `name` ([`Setting::name`]).
    pub fn from_name(name: &str) -> Option<Setting> {
        Setting::ALL.iter().copied().find(|s| s.name() == name)
    }
}

static NAMES: OnceLock<fn(Setting) -> &'static str> = OnceLock::new();

/// Installs how this process's messages spell a setting (a binary: the flag that sets it).
/// The first call wins; without one a setting shows as its name in backquotes.
pub fn name_settings(spell: fn(Setting) -> &'static str) {
    let _ = NAMES.set(spell);
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match NAMES.get() {
            Some(spell) => f.write_str(spell(*self)),
            None => write!(f, "`{}`", self.name()),
        }
    }
}

/// `text` with each setting named in backquotes (`` `batch` ``) spelled as this process
/// spells settings: for texts that must be constants.
pub fn spell(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once('`') {
        let Some((quoted, next)) = after.split_once('`') else {
            break;
        };
        out.push_str(before);
        match Setting::from_name(quoted) {
            Some(s) => out.push_str(&s.to_string()),
            None => out.push_str(&format!("`{quoted}`")),
        }
        rest = next;
    }
    out.push_str(rest);
    out
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

    /// Every field of the configuration (as a checkpoint records it) is a setting a message
    /// can name.
    #[test]
    fn spell_names_settings_only() {
        let text = "with `schedule` cosine, not `cosine`, and a lone ` quote";
        assert_eq!(spell(text), text, "no spelling installed: unchanged");
    }

    #[test]
    fn every_config_field_is_a_setting() {
        let v = serde_json::to_value(crate::TrainConfig::default()).unwrap();
        for field in v.as_object().unwrap().keys() {
            let s = Setting::from_name(field);
            assert_eq!(s.map(Setting::name), Some(field.as_str()), "{field}");
        }
    }
}
