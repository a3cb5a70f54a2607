//! The flat layout: every parameter's place in the flat f32 buffers of a replica (weights,
//! gradients, momentum) and the buckets they are cut into, in reduction order (the last layers
//! first), at stage boundaries under `overlap` backward. Under `head_parallel` the
//! classifier head is left out ([`Layout::left_out`]): each replica holds a slice of it, whose
//! gradient is its own and never reduced.

use tch::nn;

use crate::config::Overlap;
use crate::model::{self, ModelKind, Network};
use crate::variables::Variables;

/// Every parameter starts at a multiple of this many elements (64 bytes) of the flat buffers,
/// so that its views are aligned as vectorised kernels want them (a 21,841-class head's bias
/// would leave every later parameter at an odd offset); the gaps are zeros that stay zero.
pub const ALIGN: usize = 16;

/// One parameter of the model in the flat gradient buffer.
#[derive(Clone, Debug)]
pub struct ParamInfo {
    /// torchvision-style dotted name, e.g. `layer1.0.conv1.weight`.
    pub name: String,
    /// Shape.
    pub shape: Vec<i64>,
    /// Number of elements.
    pub numel: usize,
    /// Offset in the flat buffer (elements).
    pub offset: usize,
    /// Whether weight decay applies.
    pub decay: bool,
}

/// A contiguous range of the flat buffer holding whole parameters, those with weight decay
/// first, so that the optimizer updates a bucket in a few whole-range operations.
#[derive(Clone, Debug)]
pub struct Bucket {
    /// First element.
    pub start: usize,
    /// Number of elements (with the alignment gaps).
    pub len: usize,
    /// Leading elements of the bucket that belong to parameters with weight decay (and their
    /// alignment gaps).
    pub decayed: usize,
    /// Indices (into [`Layout::params`]) of the parameters in the bucket.
    pub params: Vec<usize>,
    /// The model stage whose backward completes the bucket's gradients (0 when the layout is
    /// not staged).
    pub stage: usize,
}

/// Where every parameter and buffer lives in the flat representation.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Trainable parameters in creation (forward) order.
    pub params: Vec<ParamInfo>,
    /// Non-trainable buffers (BatchNorm running statistics), sorted by name: (name, shape).
    pub buffers: Vec<(String, Vec<i64>)>,
    /// Buckets in reduction order (the last layers first).
    pub buckets: Vec<Bucket>,
    /// Elements of the flat buffers: the parameters and the gaps that align them.
    pub total: usize,
    /// Parameters left out of the flat buffers and the buckets, with their whole shapes, in
    /// creation order (offsets 0): the classifier head under `head_parallel`.
    pub left_out: Vec<ParamInfo>,
}

impl Layout {
    /// Lays out the variables of `vs` in reverse creation order, cut into buckets of about
    /// `bucket_bytes` (a larger parameter gets a bucket of its own).
    pub fn new(vs: &nn::VarStore, bucket_bytes: usize) -> Layout {
        Self::staged(vs, bucket_bytes, &|_| 0)
    }

    /// The layout the table reduces `model` (built in `vs`) with under `overlap`: one bucket
    /// (`off`), buckets of about `bucket_bytes` (`pipeline`), and cut at the model's stage
    /// boundaries as well (`backward`); with `head_parallel`, the classifier head left out.
    pub fn for_overlap(
        vs: &nn::VarStore,
        model: &dyn Network,
        overlap: Overlap,
        bucket_bytes: usize,
        head_parallel: bool,
    ) -> Layout {
        let bucketed = |name: &str| !(head_parallel && crate::weights::is_head(name));
        let layout = match overlap {
            Overlap::Off => Layout::cut(vs, usize::MAX, &|_| 0, &bucketed),
            Overlap::Pipeline => Layout::cut(vs, bucket_bytes, &|_| 0, &bucketed),
            Overlap::Backward => {
                Layout::cut(vs, bucket_bytes, &|name| model.stage_of(name), &bucketed)
            }
        };
        debug_assert!(
            layout.left_out.is_empty() || layout.left_out.len() == 2,
            "the head is one linear layer"
        );
        layout
    }

    /// Every parameter of the model in creation order: the bucketed ones, then those left out
    /// (the head, which every model creates last).
    pub fn model_params(&self) -> impl Iterator<Item = &ParamInfo> {
        self.params.iter().chain(&self.left_out)
    }

    /// The model's variables by name and shape, as its weights file holds them.
    pub fn variables(&self) -> Variables {
        Variables {
            params: (self.model_params())
                .map(|p| (p.name.clone(), p.shape.clone()))
                .collect(),
            buffers: self.buffers.clone(),
        }
    }

    /// [`Layout::for_overlap`] of `kind` with `classes` classes, built once on the CPU in a
    /// throwaway variable store: the plan of a run without its data or devices (`ddl-plan`).
    pub fn of_model(
        kind: ModelKind,
        classes: i64,
        image_size: u32,
        overlap: Overlap,
        bucket_bytes: usize,
        head_parallel: bool,
    ) -> Layout {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _guard = tch::no_grad_guard();
        let model = model::build(kind, &vs.root(), classes, image_size);
        Layout::for_overlap(&vs, model.as_ref(), overlap, bucket_bytes, head_parallel)
    }

    /// Number of parameters (elements of every parameter, without the alignment gaps).
    pub fn parameters(&self) -> usize {
        self.params.iter().map(|p| p.numel).sum()
    }

    /// Index of the largest bucket (0 for a layout without buckets).
    pub fn largest_bucket(&self) -> usize {
        (0..self.buckets.len())
            .max_by_key(|&k| self.buckets[k].len)
            .unwrap_or(0)
    }

    /// As [`Layout::new`], and a bucket never holds parameters of two stages: `stage_of` maps
    /// a variable name to its model stage ([`crate::model::Network::stage_of`]).
    pub fn staged(
        vs: &nn::VarStore,
        bucket_bytes: usize,
        stage_of: &dyn Fn(&str) -> usize,
    ) -> Layout {
        Layout::cut(vs, bucket_bytes, stage_of, &|_| true)
    }

    /// As [`Layout::staged`] for the parameters `bucketed` accepts; the others go to
    /// [`Layout::left_out`].
    pub fn cut(
        vs: &nn::VarStore,
        bucket_bytes: usize,
        stage_of: &dyn Fn(&str) -> usize,
        bucketed: &dyn Fn(&str) -> bool,
    ) -> Layout {
        let Variables { params, buffers } = Variables::of(vs);
        let params: Vec<ParamInfo> = params
            .into_iter()
            .map(|(name, shape)| ParamInfo {
                name,
                numel: shape.iter().product::<i64>() as usize,
                decay: crate::optim::decays(&shape),
                shape,
                offset: 0,
            })
            .collect();
        let (mut params, left_out): (Vec<ParamInfo>, Vec<ParamInfo>) =
            params.into_iter().partition(|p| bucketed(&p.name));
        let cap = (bucket_bytes / 4).max(1);
        let padded = |n: usize| n.next_multiple_of(ALIGN);
        let mut buckets: Vec<Bucket> = Vec::new();
        for i in (0..params.len()).rev() {
            let n = padded(params[i].numel);
            let stage = stage_of(&params[i].name);
            match buckets.last_mut() {
                Some(b) if b.len + n <= cap && b.stage == stage => {
                    b.len += n;
                    b.params.push(i);
                }
                _ => buckets.push(Bucket {
                    start: 0,
                    len: n,
                    decayed: 0,
                    params: vec![i],
                    stage,
                }),
            }
        }
        // Offsets: buckets in reduction order, and in each the decayed parameters first.
        let mut offset = 0;
        for b in &mut buckets {
            b.start = offset;
            b.params.sort_by_key(|&i| !params[i].decay);
            for &i in &b.params {
                params[i].offset = offset;
                offset += padded(params[i].numel);
                if params[i].decay {
                    b.decayed = offset - b.start;
                }
            }
        }
        Layout {
            params,
            buffers,
            buckets,
            total: offset,
            left_out,
        }
    }
}
