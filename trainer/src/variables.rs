//! A network's variables by name and shape: what its weights file holds, without the flat
//! buffers and buckets the table trains them in ([`crate::table::Layout`]).

use std::collections::{HashMap, HashSet};

use tch::nn;

use crate::model::{self, ModelKind};

/// One variable: its torchvision name and its shape.
pub type Variable = (String, Vec<i64>);

/// The variables of a network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Variables {
    /// Trainable parameters in creation order (the classifier head last).
    pub params: Vec<Variable>,
    /// Non-trainable buffers (BatchNorm running statistics), sorted by name.
    pub buffers: Vec<Variable>,
}

impl Variables {
    /// The variables of the network built in `vs`.
    pub fn of(vs: &nn::VarStore) -> Variables {
        let named = vs.variables();
        let by_ptr: HashMap<usize, &String> = named
            .iter()
            .map(|(n, t)| (t.data_ptr() as usize, n))
            .collect();
        let params: Vec<Variable> = vs
            .trainable_variables()
            .iter()
            .map(|t| {
                let name = by_ptr.get(&(t.data_ptr() as usize));
                (name.map(|s| s.to_string()).unwrap_or_default(), t.size())
            })
            .collect();
        let trainable: HashSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        let mut buffers: Vec<Variable> = named
            .iter()
            .filter(|(n, _)| !trainable.contains(n.as_str()))
            .map(|(n, t)| (n.clone(), t.size()))
            .collect();
        buffers.sort();
        Variables { params, buffers }
    }

    /// The variables of `kind` with `classes` classes at `image_size`, built once on the CPU
    /// in a throwaway variable store.
    ///
    /// # Examples
    ///
    /// ```
    /// use ddl_trainer::model::ModelKind;
    /// use ddl_trainer::variables::Variables;
    ///
    /// let vars = Variables::of_model(ModelKind::ResnetSmall, 10, 32);
    /// let (head, shape) = vars.params.last().unwrap();
    /// assert!(head.starts_with("fc.") && shape[0] == 10);
    /// assert!(vars.buffers.iter().any(|(n, _)| n == "bn1.running_mean"));
    /// ```
    pub fn of_model(kind: ModelKind, classes: i64, image_size: u32) -> Variables {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _guard = tch::no_grad_guard();
        let _model = model::build(kind, &vs.root(), classes, image_size);
        Variables::of(&vs)
    }
}
