//! How the trainer's binaries spell the library's settings: the flag that sets each one. The
//! library names a [`Setting`] in its errors and messages; each binary installs [`flag`]
//! first thing (`name_settings`), so a message names the flag exactly as the user types it.
//! `ddl-train`'s flags are defined in its `Cli` (main.rs) and become a `TrainConfig` in
//! `Cli::config`; a switch that turns a setting off (`--no-eval`, `--quiet`) names it.

use ddl_trainer::Setting;

/// The flag that sets `setting` (ddl-predict's and ddl-export's included).
pub fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Data => "--data",
        Setting::SyntheticData => "--synthetic-data",
        Setting::Classes => "--classes",
        Setting::Deterministic => "--deterministic",
        Setting::Model => "--model",
        Setting::Epochs => "--epochs",
        Setting::Batch => "--batch",
        Setting::Devices => "--devices",
        Setting::ImageSize => "--image-size",
        Setting::Workers => "--workers",
        Setting::Prefetch => "--prefetch",
        Setting::Seed => "--seed",
        Setting::BaseLr => "--base-lr",
        Setting::Lr => "--lr",
        Setting::Momentum => "--momentum",
        Setting::Nesterov => "--nesterov",
        Setting::WeightDecay => "--weight-decay",
        Setting::WarmupEpochs => "--warmup-epochs",
        Setting::Schedule => "--schedule",
        Setting::Milestones => "--milestones",
        Setting::Gamma => "--gamma",
        Setting::LabelSmoothing => "--label-smoothing",
        Setting::Compile => "--compile",
        Setting::CompileCache => "--compile-cache",
        Setting::Precision => "--precision",
        Setting::Metrics => "--metrics",
        Setting::TraceRecords => "--trace-records",
        Setting::CheckpointDir => "--checkpoint-dir",
        Setting::CheckpointEvery => "--checkpoint-every",
        Setting::KeepCheckpoints => "--keep-checkpoints",
        Setting::Resume => "--resume",
        Setting::Restart => "--restart",
        Setting::AllowNewLayout => "--allow-new-layout",
        Setting::MaxSteps => "--max-steps",
        Setting::Allreduce => "--allreduce",
        Setting::CostModel => "--cost-model",
        Setting::SaveCostModel => "--save-cost-model",
        Setting::HeadParallel => "--head-parallel",
        Setting::Gather => "--gather",
        Setting::DumpWeights => "--dump-weights",
        Setting::Export => "--export",
        Setting::InitFrom => "--init-from",
        Setting::ResetHead => "--reset-head",
        Setting::CheckReplicas => "--check-replicas",
        Setting::Residency => "--residency",
        Setting::Exchange => "--exchange",
        Setting::Overlap => "--overlap",
        Setting::CommOrder => "--comm-order",
        Setting::BucketMb => "--bucket-mb",
        Setting::ChannelsLast => "--channels-last",
        Setting::Eval => "--no-eval",
        Setting::EvalResize => "--eval-resize",
        Setting::EvalResizeRatio => "--eval-resize-ratio",
        Setting::ImageSizeSchedule => "--image-size-schedule",
        Setting::CropScale => "--crop-scale",
        Setting::CropRatio => "--crop-ratio",
        Setting::FlipProb => "--flip-prob",
        Setting::Mean => "--mean",
        Setting::Std => "--std",
        Setting::Populate => "--populate",
        Setting::Lock => "--mlock",
        Setting::Stage => "--stage",
        Setting::CommTimeoutS => "--comm-timeout",
        Setting::OnBadRecord => "--on-bad-record",
        Setting::Verbose => "--quiet",
        Setting::Device => "--device",
        Setting::Arch => "--arch",
        Setting::Output => "-o",
    }
}

/// Installs [`flag`] as this process's spelling of settings.
pub fn install() {
    ddl_trainer::setting::name_settings(flag);
}
