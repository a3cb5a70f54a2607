//! `auto` ([`crate::Algorithm::Auto`]): one more algorithm, over its candidates
//! ([`auto_candidates`]). Per call it runs the algorithm the online tuning tries or settled on
//! for the size class ([`super::tune`]), or the cost model's choice; it probes the node's
//! shared memory on its first call on one node, and there checks every call in the shared
//! region whatever it runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::call_check::check_calls;
use super::context::{Allreduce, Context};
use super::element::{with_elements, Buffer, Element};
use super::hierarchical::{Across, Hierarchical, HierarchicalRun};
use super::shm::{Shm, ShmRun};
use super::signature::Signature;
use super::tune::{self, Choice, Plan, Tuner};
use crate::algorithm::{auto_candidates, Algorithm};
use crate::cost::{CostModel, MeasuredCurve};
use crate::error::{CommError, Result};
use crate::topology::Topology;

/// Whether the ranks of each node share its memory: not yet probed, yes or no (same on all
/// ranks). On one node `shm` probes it, on several `hierarchical`.
const SHM_UNKNOWN: u8 = 0;
const SHM_YES: u8 = 1;
const SHM_NO: u8 = 2;

/// Most sizes whose choice is remembered (the memo starts over beyond).
const MAX_CHOICES: usize = 1024;

/// `auto` and its candidates.
pub(crate) struct Auto {
    /// `shm` (one node): also where the ranks meet for the call check.
    shm: ShmRun,
    /// `hierarchical` with rhd between the nodes (several nodes of several ranks): the model's
    /// choice without shared memory runs instead where the nodes' ranks turn out not to share it.
    hierarchical: HierarchicalRun,
    /// The other candidates, each with the algorithm it runs.
    others: Vec<(Algorithm, Box<dyn Allreduce>)>,
    /// [`SHM_UNKNOWN`], [`SHM_YES`] or [`SHM_NO`]: known after the first call that probed.
    shm_probe: AtomicU8,
    /// The model's choices by (bytes, shared memory allowed): it is asked once per size.
    choices: Mutex<HashMap<(usize, bool), Algorithm>>,
    /// The online tuning, when the model measured nothing in this layout.
    tuner: Option<Mutex<Tuner>>,
}

impl Auto {
    /// `auto` before [`Allreduce::prepare`] builds its candidates.
    pub(crate) fn new() -> Auto {
        Auto {
            shm: ShmRun::new(Shm::DEFAULT),
            hierarchical: HierarchicalRun::new(Hierarchical::DEFAULT),
            others: Vec::new(),
            shm_probe: AtomicU8::new(SHM_UNKNOWN),
            choices: Mutex::new(HashMap::new()),
            tuner: None,
        }
    }

    /// The algorithm a call of `bytes` runs in `cx`: the tuned choice once the ranks agreed on
    /// one at this size class, otherwise the cost model's.
    pub(crate) fn resolve(&self, cx: &Context, bytes: usize) -> Algorithm {
        let shared = self.shared();
        if let Some(tuner) = &self.tuner {
            let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = tuner.chosen(bytes, shared) {
                return c.algorithm.clone();
            }
        }
        self.modelled(cx, bytes, shared)
    }

    /// Whether it tunes itself online.
    pub(crate) fn tunes(&self) -> bool {
        self.tuner.is_some()
    }

    /// Whether the next call of `bytes` is a trial of the online tuning.
    pub(crate) fn tuning(&self, bytes: usize) -> bool {
        self.tuner.as_ref().is_some_and(|tuner| {
            let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
            tuner.chosen(bytes, self.shared()).is_none()
        })
    }

    /// The tuning's choices made since the last call.
    pub(crate) fn take_tuned(&self) -> Vec<Choice> {
        self.tuner.as_ref().map_or_else(Vec::new, |tuner| {
            tuner.lock().unwrap_or_else(|e| e.into_inner()).take_fresh()
        })
    }

    /// The sizes the tuning settled, as curves measured in `topology`'s layout (`None`
    /// without tuning).
    pub(crate) fn curves(&self, topology: Topology) -> Option<Vec<MeasuredCurve>> {
        let tuner = self.tuner.as_ref()?;
        let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
        Some(tuner.curves(topology))
    }

    /// Whether the ranks may share memory (found, or not probed yet).
    fn shared(&self) -> bool {
        self.shm_probe.load(Ordering::Relaxed) != SHM_NO
    }

    /// Records what a probe of shared memory found.
    fn found(&self, shared: bool) {
        let found = if shared { SHM_YES } else { SHM_NO };
        self.shm_probe.store(found, Ordering::Relaxed);
    }

    /// The candidates in `cx`, each distinct.
    fn candidates(&self, cx: &Context, shared: bool) -> Vec<Algorithm> {
        let native = cx.transport.has_native_allreduce();
        tune::distinct(auto_candidates(cx.topology, shared, native), cx.topology)
    }

    /// The cost model's choice for `bytes` (asked once per size).
    fn modelled(&self, cx: &Context, bytes: usize, shared: bool) -> Algorithm {
        let mut choices = self.choices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = choices.get(&(bytes, shared)) {
            return a.clone();
        }
        if choices.len() >= MAX_CHOICES {
            choices.clear();
        }
        let candidates = self.candidates(cx, shared);
        let a = cx.model.choose_among(bytes, cx.topology, &candidates);
        choices.insert((bytes, shared), a.clone());
        a
    }

    /// What the next call of `bytes` runs, and whether it is a trial.
    fn plan(&self, cx: &Context, bytes: usize) -> (Algorithm, bool) {
        let shared = self.shared();
        match &self.tuner {
            Some(tuner) if bytes > 0 => {
                let mut tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
                match tuner.plan(bytes, shared, || self.candidates(cx, shared)) {
                    Plan::Chosen(a) => (a, false),
                    Plan::Trial(a) => (a, true),
                }
            }
            _ => (self.modelled(cx, bytes, shared), false),
        }
    }

    /// One call: the algorithm the tuning tries or settled on for this size class (or the cost
    /// model's), timed while the tuning lasts; after the class's last trial the ranks agree
    /// on the fastest ([`tune`]).
    fn call<T: Element>(
        &self,
        cx: &Context,
        buf: &mut [T],
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let bytes = 4 * buf.len();
        if cx.topology.nodes == 1 {
            // Probed on the first call whatever its size, before anything is planned.
            let found = self
                .shm
                .with_region(&*cx.transport, |region| Ok(region.is_some()))?;
            self.found(found);
        }
        let shared = self.shared();
        let (algorithm, trial) = self.plan(cx, bytes);
        let mut check = check;
        if trial {
            // The ranks start a trial call together (see `tune::call_times`): the call check
            // goes first, on its own, and is the synchronisation. Ranks that passed other
            // sizes may be at other stages of their tuning, so nothing they do before it may
            // depend on the size.
            match check.take() {
                Some(mine) => self.check_alone(cx, mine)?,
                None => cx.transport.barrier()?,
            }
        }
        let start = Instant::now();
        self.run(cx, buf, average, check, &algorithm)?;
        let Some(tuner) = self
            .tuner
            .as_ref()
            .filter(|_| trial && shared == self.shared())
        else {
            return Ok(());
        };
        let mut tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
        if tuner.record(bytes, shared, start.elapsed().as_secs_f64()) {
            tuner.agree(&*cx.transport, bytes, shared)?;
        }
        Ok(())
    }

    /// Whether the ranks share one node's memory, found (then `shm` and the call check run
    /// in its region).
    fn on_shared_node(&self, cx: &Context) -> bool {
        cx.topology.nodes == 1 && self.shm_probe.load(Ordering::Relaxed) == SHM_YES
    }

    /// The call check without a call: where all ranks meet whatever they run (see
    /// [`Auto::run`]).
    fn check_alone(&self, cx: &Context, mine: Signature) -> Result<()> {
        let t = &*cx.transport;
        if self.on_shared_node(cx) {
            return self.shm.with_region(t, |region| match region {
                Some(shm) => shm.check(t, mine),
                None => check_calls(t, mine, false),
            });
        }
        check_calls(t, mine, false)
    }

    /// Runs `algorithm`, the call check first. Ranks of different sizes may run different
    /// algorithms, so all must meet in the same check whatever they run: in the shared
    /// memory when the ranks share one node, where `shm` runs it in its own first
    /// synchronisation and the others alone
    /// ([`ShmAllreduce::check`](super::shm::ShmAllreduce::check)); otherwise [`check_calls`].
    fn run<T: Element>(
        &self,
        cx: &Context,
        buf: &mut [T],
        average: bool,
        check: Option<Signature>,
        algorithm: &Algorithm,
    ) -> Result<()> {
        let t = &*cx.transport;
        if self.on_shared_node(cx) {
            if *algorithm == Algorithm::SHM {
                return self.shm.run(t, buf, average);
            }
            if let Some(mine) = check {
                self.check_alone(cx, mine)?;
            }
            return self
                .other(algorithm)?
                .allreduce(cx, T::buffer(buf), average, None);
        }
        if let Some(mine) = check {
            check_calls(t, mine, false)?;
        }
        if *algorithm == Algorithm::hierarchical(Across::Rhd) {
            let ran = self.hierarchical.with_groups(cx, |groups| {
                self.found(groups.is_some());
                match groups {
                    Some(h) => h.allreduce(t, &mut *buf, average, None).map(|()| true),
                    None => Ok(false),
                }
            })?;
            if ran {
                return Ok(());
            }
            // No shared memory after all: the model's choice without it.
            let algorithm = self.modelled(cx, 4 * buf.len(), false);
            return self
                .other(&algorithm)?
                .allreduce(cx, T::buffer(buf), average, None);
        }
        self.other(algorithm)?
            .allreduce(cx, T::buffer(buf), average, None)
    }

    /// The candidate that runs `algorithm` (not `shm` nor `hierarchical`).
    fn other(&self, algorithm: &Algorithm) -> Result<&dyn Allreduce> {
        self.others
            .iter()
            .find(|(a, _)| a == algorithm)
            .map(|(_, other)| &**other)
            .ok_or_else(|| {
                CommError::InvalidArgument(format!(
                    "auto cannot run {algorithm} here: it is none of its candidates"
                ))
            })
    }
}

impl Allreduce for Auto {
    /// Decides whether it tunes itself (its model measured nothing in this layout: a
    /// calibrated or saved model wins when given) and builds the candidates.
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        self.tuner = (!cx.model.measures(cx.topology)).then(|| Mutex::new(Tuner::default()));
        let (shm, hierarchical) = (Algorithm::SHM, Algorithm::hierarchical(Across::Rhd));
        let native = cx.transport.has_native_allreduce();
        for a in auto_candidates(cx.topology, true, native) {
            if a == shm || a == hierarchical {
                continue;
            }
            if let Some(mut other) = a.implement() {
                other.prepare(cx)?;
                self.others.push((a, other));
            }
        }
        Ok(())
    }

    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        with_elements!(buf, b => self.call(cx, b, average, check))
    }

    /// The best prediction among [`auto_candidates`] (`shm` and `mpi` included).
    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        model.predict(&Algorithm::Auto, bytes, topo)
    }
}
