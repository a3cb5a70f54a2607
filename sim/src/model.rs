//! The model the simulator predicts with: ddl-comm's [`CostModel`] and the [`Contention`] of
//! compute and communication on shared cores. Both live in one file, the cost model's, under
//! the field `contention` (as `ddl-bench calibrate` has always written it): ddl-comm keeps the
//! field among the ones it does not read ([`CostModel::other`]), so every reader of a cost
//! model takes the file, and a file without it has [`Contention::SEPARATE`].

use std::path::Path;

use ddl_comm::{CommError, CostModel, Result};
use serde::{Deserialize, Serialize};

use crate::contention::Contention;

/// The cost model's field that holds the contention.
const CONTENTION: &str = "contention";

/// A cost model with the contention measured beside it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "CostModel", try_from = "CostModel")]
pub struct StepModel {
    /// The allreduce costs, as `auto` reads them.
    pub cost: CostModel,
    /// How the allreduce and compute threads on the same cores slow each other
    /// (`ddl-bench sim --cpu-replicas`); [`Contention::SEPARATE`] where not measured.
    pub contention: Contention,
}

impl StepModel {
    /// `cost` with compute and communication on resources of their own (presets, GPUs).
    pub fn separate(cost: CostModel) -> StepModel {
        StepModel {
            cost,
            contention: Contention::SEPARATE,
        }
    }

    /// Reads a model saved by [`StepModel::save`] or [`CostModel::save`].
    pub fn load(path: &Path) -> Result<StepModel> {
        StepModel::try_from(CostModel::load(path)?).map_err(|e| CommError::CostModelFile {
            path: path.to_path_buf(),
            message: format!("{CONTENTION}: {e}"),
        })
    }

    /// Writes the model as the cost model's pretty JSON, the contention in its field.
    pub fn save(&self, path: &Path) -> Result<()> {
        CostModel::from(self.clone()).save(path)
    }
}

impl From<StepModel> for CostModel {
    fn from(model: StepModel) -> CostModel {
        let mut cost = model.cost;
        let contention =
            serde_json::to_value(model.contention).expect("a Contention is plain numbers");
        cost.other.insert(CONTENTION.into(), contention);
        cost
    }
}

impl TryFrom<CostModel> for StepModel {
    type Error = serde_json::Error;

    fn try_from(mut cost: CostModel) -> std::result::Result<StepModel, serde_json::Error> {
        let contention = match cost.other.remove(CONTENTION) {
            Some(value) => serde_json::from_value(value)?,
            None => Contention::SEPARATE,
        };
        Ok(StepModel { cost, contention })
    }
}
