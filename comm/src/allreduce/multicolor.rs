//! Multi-color allreduce (Kumar et al. 2017): the buffer is cut into k colors; color c is
//! reduced to the root of its own tree and broadcast back down it. The trees differ in root
//! and rank order so that each rank is interior in exactly one color and a leaf in the
//! others, which spreads the fan-in work evenly. All colors progress together in one
//! exchange batch per step, and each color is pipelined in chunks.

use std::ops::Range;

use std::sync::OnceLock;

use super::context::{Allreduce, Context, Scratch};
use super::declare::{positive, Declare, Declared};
use super::element::add_into;
use super::messages::Messages;
use super::util::{ensure_len, part, RawBuf};
use crate::cost::{CostModel, Round};
use crate::error::{CommError, Result};
use crate::tags::MAX_COLORS;
use crate::tags::MULTICOLOR;
use crate::topology::Topology;
use crate::transport::{Op, Transport};

/// This rank's place in the tree of one color.
#[derive(Clone, Debug)]
struct ColorNode {
    /// Parent rank (None at the root).
    parent: Option<usize>,
    /// Children as (rank, height of the child's subtree), in rank order.
    children: Vec<(usize, usize)>,
    /// Height of this rank's subtree (leaves 0).
    height: usize,
    /// Distance from the root.
    depth: usize,
    /// Height of the whole tree.
    root_height: usize,
    /// Offset of this color's child slots in the scratch buffer, in chunks.
    slot_base: usize,
}

/// Tree parent of `r` in color `c` of `colors` over `p` ranks. Interior ranks of color c are
/// `c, c+k, c+2k, ...` arranged as a binary heap (root c); a leaf `r` hangs under the interior
/// rank of its block of k consecutive ranks.
fn parent_of(p: usize, k: usize, c: usize, r: usize) -> Option<usize> {
    let interior = (p - c).div_ceil(k);
    if r % k == c {
        let j = r / k;
        (j > 0).then(|| c + (j - 1) / 2 * k)
    } else {
        Some(c + (r / k).min(interior - 1) * k)
    }
}

/// Tree parents of all ranks in color `c` of `k` colors over `topo` (`k <= topo.ranks()`).
///
/// One node (or one rank per node): the rank-level layout of [`parent_of`]. Several nodes of
/// several ranks: a two-level layout that crosses the node links as little as possible.
/// Inside each node, the other ranks hang under one leader; the leaders form the rank-level
/// layout over nodes (node-level color `c mod min(k, nodes)`, so the colors are rooted on
/// different nodes). The leader's local rank, `(c + c / L) mod ranks_per_node` with L the
/// least common multiple of `min(k, nodes)` and `ranks_per_node`, rotates with the color:
/// up to `min(k, nodes) x ranks_per_node` colors, no two colors share both the node-level
/// tree and the leader, and the colors are spread evenly over the ranks of a node, so all
/// of them drive its link and share the fan-in work. A node then sends one chunk
/// per color up (or, at a root, one down per child node): with k = nodes colors each node
/// link carries 2(nodes-1)/nodes of the buffer each way, the bandwidth lower bound.
pub(crate) fn parents(topo: Topology, k: usize, c: usize) -> Vec<Option<usize>> {
    let p = topo.ranks();
    let (nodes, g) = (topo.nodes, topo.ranks_per_node);
    if nodes == 1 || g == 1 {
        return (0..p).map(|r| parent_of(p, k, c, r)).collect();
    }
    let kn = k.min(nodes);
    let cn = c % kn;
    let lcm = kn / gcd(kn, g) * g;
    let leader = (c + c / lcm) % g;
    (0..p)
        .map(|r| {
            let (node, local) = (r / g, r % g);
            if local != leader {
                Some(node * g + leader)
            } else {
                parent_of(nodes, kn, cn, node).map(|q| q * g + leader)
            }
        })
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The tree of one color over all ranks.
#[derive(Clone, Debug)]
pub(crate) struct Tree {
    /// Parent of each rank (None at the root).
    pub parent: Vec<Option<usize>>,
    /// Height of each rank's subtree (leaves 0).
    pub height: Vec<usize>,
    /// Distance of each rank from the root.
    pub depth: Vec<usize>,
    /// Height of the whole tree.
    pub root_height: usize,
}

impl Tree {
    /// The tree of color `c` of `k` colors over `topo` (see [`parents`]).
    pub(crate) fn new(topo: Topology, k: usize, c: usize) -> Tree {
        let parent = parents(topo, k, c);
        let p = parent.len();
        let depth: Vec<usize> = (0..p)
            .map(|r| {
                let mut d = 0;
                let mut x = r;
                while let Some(q) = parent[x] {
                    d += 1;
                    x = q;
                }
                d
            })
            .collect();
        // Heights bottom-up over ranks sorted by decreasing depth.
        let mut order: Vec<usize> = (0..p).collect();
        order.sort_by_key(|&r| std::cmp::Reverse(depth[r]));
        let mut height = vec![0usize; p];
        for &r in &order {
            if let Some(q) = parent[r] {
                height[q] = height[q].max(height[r] + 1);
            }
        }
        let root_height = (0..p)
            .find(|&r| parent[r].is_none())
            .map_or(0, |root| height[root]);
        Tree {
            parent,
            height,
            depth,
            root_height,
        }
    }
}

/// Precomputed trees of all colors for one rank.
#[derive(Clone, Debug)]
pub(crate) struct MulticolorPlan {
    colors: usize,
    chunk_elems: usize,
    nodes: Vec<ColorNode>,
    slots: usize,
}

impl MulticolorPlan {
    /// Builds the trees for `colors` colors (at most the rank count) over the ranks of
    /// `topo` (see [`parents`]), seen from `rank`.
    pub(crate) fn new(
        topo: Topology,
        rank: usize,
        colors: usize,
        chunk_bytes: usize,
    ) -> MulticolorPlan {
        let p = topo.ranks();
        let k = colors.clamp(1, p.max(1));
        let mut nodes = Vec::with_capacity(k);
        let mut slots = 0;
        for c in 0..k {
            let tree = Tree::new(topo, k, c);
            let node = ColorNode {
                parent: tree.parent[rank],
                children: (0..p)
                    .filter(|&r| tree.parent[r] == Some(rank))
                    .map(|ch| (ch, tree.height[ch]))
                    .collect(),
                height: tree.height[rank],
                depth: tree.depth[rank],
                root_height: tree.root_height,
                slot_base: slots,
            };
            slots += node.children.len();
            nodes.push(node);
        }
        MulticolorPlan {
            colors: k,
            chunk_elems: (chunk_bytes / 4).max(1),
            nodes,
            slots,
        }
    }
}

/// Message counts of one lock-step step of the multi-color schedule (all chunks full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepCount {
    /// Most node-local chunks one rank sends or receives (the larger of the two).
    pub local: usize,
    /// Most chunks leaving one node over its link.
    pub link: usize,
    /// Most child chunks one rank adds after the step.
    pub adds: usize,
}

/// The steps of the multi-color allreduce with `chunks` chunks per color over `topo`, as
/// `(number of consecutive steps, their counts)` runs: every step of a run moves the same
/// chunks (the schedule of [`allreduce`]: a rank of height h sends chunk j up at step
/// j + h; a rank at depth d sends the final chunk j down at step j + H + d).
pub(crate) fn schedule(topo: Topology, colors: usize, chunks: usize) -> Vec<(usize, StepCount)> {
    let p = topo.ranks();
    let k = colors.clamp(1, p.max(1));
    if p <= 1 || chunks == 0 {
        return Vec::new();
    }
    let trees: Vec<Tree> = (0..k).map(|c| Tree::new(topo, k, c)).collect();
    // Steps at which some rank starts or stops sending: between two of them nothing changes.
    let mut marks = vec![0usize];
    for t in &trees {
        for r in 0..p {
            if let Some(q) = t.parent[r] {
                let down = t.root_height + t.depth[q];
                marks.extend([t.height[r], t.height[r] + chunks, down, down + chunks]);
            }
        }
    }
    marks.sort_unstable();
    marks.dedup();
    let (mut sends, mut recvs, mut adds) = (vec![0; p], vec![0; p], vec![0; p]);
    let mut link = vec![0; topo.nodes];
    let active = |start: usize, step: usize| step >= start && step < start + chunks;
    marks
        .windows(2)
        .map(|w| {
            let step = w[0];
            sends.fill(0);
            recvs.fill(0);
            adds.fill(0);
            link.fill(0);
            for t in &trees {
                for r in 0..p {
                    let Some(q) = t.parent[r] else { continue };
                    let mut message = |from: usize, to: usize| {
                        if topo.node_of(from) == topo.node_of(to) {
                            sends[from] += 1;
                            recvs[to] += 1;
                        } else {
                            link[topo.node_of(from)] += 1;
                        }
                    };
                    if active(t.height[r], step) {
                        message(r, q);
                        adds[q] += 1;
                    }
                    if active(t.root_height + t.depth[q], step) {
                        message(q, r);
                    }
                }
            }
            let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
            let count = StepCount {
                local: most(&sends).max(most(&recvs)),
                link: most(&link),
                adds: most(&adds),
            };
            (w[1] - w[0], count)
        })
        .filter(|(_, c)| *c != StepCount::default())
        .collect()
}

fn tag_reduce(c: usize) -> u32 {
    MULTICOLOR.tag(2 * c as u32)
}

fn tag_bcast(c: usize) -> u32 {
    MULTICOLOR.tag(2 * c as u32 + 1)
}

/// Step at which chunk `j` is handled when the handling of chunk 0 happens at step `offset`.
fn chunk_at(step: usize, offset: usize, chunks: usize) -> Option<usize> {
    step.checked_sub(offset).filter(|&j| j < chunks)
}

/// Sums `buf` over all ranks of `t` along the plan's trees.
///
/// Schedule of color c with J chunks and tree height H: a rank of height h sends chunk j to
/// its parent at step j + h (after its children's chunk j arrived at steps <= j + h - 1); the
/// root holds the sum of chunk j after step j + H - 1; a rank at depth d sends the final
/// chunk j to its children at step j + H + d. Each element is summed only by its color's
/// root and then copied, so all ranks end bitwise identical.
pub(crate) fn allreduce(
    t: &dyn Transport,
    plan: &MulticolorPlan,
    buf: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let n = buf.len();
    let ce = plan.chunk_elems;
    let whole = 0..n;
    let colors: Vec<(Range<usize>, usize)> = (0..plan.colors)
        .map(|c| {
            let r = part(&whole, plan.colors, c);
            // An empty color still sends its one empty chunk: the first step then posts the
            // same operations whatever the length (the call check rides on it at two ranks).
            let chunks = r.len().div_ceil(ce).max(1);
            (r, chunks)
        })
        .collect();
    let steps = colors
        .iter()
        .zip(&plan.nodes)
        .map(|((_, j), node)| j + 2 * node.root_height)
        .max()
        .unwrap_or(0);
    ensure_len(scratch, plan.slots * ce);
    let chunk = |c: usize, j: usize| -> Range<usize> {
        let r = &colors[c].0;
        let s = r.start + j * ce;
        s..(s + ce).min(r.end)
    };
    let raw = RawBuf::new(buf);
    let slots = RawBuf::new(scratch);
    let mut ops: Vec<Op<'_>> = Vec::with_capacity(plan.slots * 2 + 2 * plan.colors + 8);
    // (slot element offset, chunk range) to add after the step's exchange.
    let mut adds: Vec<(usize, Range<usize>)> = Vec::with_capacity(plan.slots);
    for step in 0..steps {
        ops.clear();
        adds.clear();
        for (c, node) in plan.nodes.iter().enumerate() {
            let chunks = colors[c].1;
            let h_root = node.root_height;
            // Reduce: receive each child's partial sums.
            for (i, &(child, hc)) in node.children.iter().enumerate() {
                if let Some(j) = chunk_at(step, hc, chunks) {
                    let range = chunk(c, j);
                    let off = (node.slot_base + i) * ce;
                    // SAFETY: each (color, child) slot is used by one receive per step.
                    let dst = unsafe { slots.bytes_mut(off..off + range.len()) };
                    ops.push(Op::Recv {
                        from: child,
                        tag: tag_reduce(c),
                        buf: dst,
                    });
                    adds.push((off, range));
                }
            }
            if let Some(parent) = node.parent {
                // Reduce: send this subtree's sum of chunk j.
                if let Some(j) = chunk_at(step, node.height, chunks) {
                    // SAFETY: chunk j (sent up) differs from every chunk written this step: the
                    // broadcast receive is chunk j + h + 1 - H - d <= j - 1 (h + d <= H), and
                    // child sums land in scratch slots.
                    let src = unsafe { raw.bytes(chunk(c, j)) };
                    ops.push(Op::Send {
                        to: parent,
                        tag: tag_reduce(c),
                        data: src,
                    });
                }
                // Broadcast: receive the final chunk from the parent.
                if let Some(j) = chunk_at(step, h_root + node.depth - 1, chunks) {
                    // SAFETY: no other operation of this step touches this chunk: the chunk
                    // forwarded to children is j - 1 and the chunk sent up is later.
                    let dst = unsafe { raw.bytes_mut(chunk(c, j)) };
                    ops.push(Op::Recv {
                        from: parent,
                        tag: tag_bcast(c),
                        buf: dst,
                    });
                }
            }
            // Broadcast: forward the final chunk to the children.
            if let Some(j) = chunk_at(step, h_root + node.depth, chunks) {
                for &(child, _) in &node.children {
                    // SAFETY: read-only view of a chunk no operation of this step writes.
                    let src = unsafe { raw.bytes(chunk(c, j)) };
                    ops.push(Op::Send {
                        to: child,
                        tag: tag_bcast(c),
                        data: src,
                    });
                }
            }
        }
        if ops.is_empty() {
            continue;
        }
        t.exchange(&mut ops)?;
        ops.clear();
        for (off, range) in adds.drain(..) {
            let len = range.len();
            // SAFETY: the exchange is complete; no other view of these ranges is alive.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(raw.ptr_at(range.start), len);
                let src = std::slice::from_raw_parts(slots.ptr_at(off), len);
                add_into(dst, src);
            }
        }
    }
    Ok(())
}

/// Default pipeline chunk of `multicolor`, in bytes. Every pipeline step is a lock-step
/// exchange among tree neighbours, so on slow links each step costs milliseconds of
/// synchronisation and larger chunks ran faster there (BENCHMARKS.md, "Figures behind the
/// defaults").
const DEFAULT_CHUNK_BYTES: usize = 1024 * 1024;

/// The multi-color allreduce's parameters ([`crate::Algorithm::Multicolor`]): `colors` trees
/// with distinct roots and interior nodes, run concurrently, each pipelined in chunks of
/// `chunk_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multicolor {
    /// Number of colors (buffer parts / trees).
    pub colors: usize,
    /// Pipeline chunk in bytes.
    pub chunk_bytes: usize,
}

impl Multicolor {
    /// Four colors in chunks of 1 MiB.
    pub const DEFAULT: Multicolor = Multicolor {
        colors: 4,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
    };
}

impl Default for Multicolor {
    fn default() -> Multicolor {
        Multicolor::DEFAULT
    }
}

impl Declare for Multicolor {
    const DECLARED: Declared = Declared {
        name: "multicolor",
        syntax: "multicolor[:COLORS[:CHUNK_BYTES]]",
        help: "COLORS trees (4) with distinct roots and interior nodes, run at once, each \
               pipelined in chunks (1 MiB)",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Multicolor> {
        let mut params = Multicolor::DEFAULT;
        if let Some(args) = args {
            let mut it = args.split(':');
            if let Some(c) = it.next() {
                params.colors = positive(c, "color count")?;
            }
            if let Some(c) = it.next() {
                params.chunk_bytes = positive(c, "chunk bytes")?;
            }
        }
        Ok(params)
    }

    /// Always printed in full (`multicolor:4:1048576`): a measured curve names its parameters.
    fn args(&self) -> Option<String> {
        Some(format!("{}:{}", self.colors, self.chunk_bytes))
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(MulticolorRun {
            params: *self,
            plan: OnceLock::new(),
        })
    }
}

/// The multi-color allreduce as it runs: its parameters and this rank's plan of its trees.
struct MulticolorRun {
    params: Multicolor,
    plan: OnceLock<MulticolorPlan>,
}

impl MulticolorRun {
    /// This rank's trees in `cx` (made on first use).
    fn plan(&self, cx: &Context) -> &MulticolorPlan {
        self.plan.get_or_init(|| {
            let rank = cx.transport.rank();
            let Multicolor {
                colors,
                chunk_bytes,
            } = self.params;
            MulticolorPlan::new(cx.topology, rank, colors, chunk_bytes)
        })
    }
}

impl Messages for MulticolorRun {
    fn setup(&mut self, cx: &Context) -> Result<()> {
        let Multicolor {
            colors,
            chunk_bytes,
        } = self.params;
        if colors == 0 || colors > MAX_COLORS || chunk_bytes < 4 {
            return Err(CommError::InvalidArgument(format!(
                "multicolor needs 1..={MAX_COLORS} colors and chunks of at least 4 bytes, got {colors} colors, {chunk_bytes} bytes"
            )));
        }
        self.plan(cx);
        Ok(())
    }

    fn run(
        &self,
        cx: &Context,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        allreduce(t, self.plan(cx), buf, &mut scratch.recv)
    }

    /// One message each way at two ranks with two colors or more.
    fn rides(&self) -> bool {
        self.params.colors >= 2
    }

    fn cost(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        let Multicolor {
            colors,
            chunk_bytes,
        } = self.params;
        model.multicolor_time(colors, chunk_bytes, bytes as f64, topo)
    }
}

/// The multi-color allreduce's cost formula.
impl CostModel {
    /// Seconds of the multi-color allreduce: the steps of its schedule, each costing the
    /// busiest rank's node-local chunks or the busiest node link's chunks (whichever is
    /// slower), then the busiest rank's additions.
    pub(crate) fn multicolor_time(
        &self,
        colors: usize,
        chunk_bytes: usize,
        n: f64,
        topo: Topology,
    ) -> f64 {
        let k = colors.clamp(1, topo.ranks());
        let per_color = n / k as f64;
        let chunk = (chunk_bytes.max(4) as f64).min(per_color);
        let chunks = (per_color / chunk).ceil() as usize;
        schedule(topo, k, chunks)
            .into_iter()
            .map(|(steps, c)| {
                let link = c.link as f64 * chunk;
                let round = Round {
                    alpha: if c.link > 0 {
                        self.inter.alpha
                    } else {
                        self.intra.alpha
                    },
                    local: c.local as f64 * self.intra.xfer_in(chunk, n),
                    link: self.inter.xfer(link),
                    add: c.adds as f64 * chunk * self.intra.gamma,
                };
                steps as f64 * round.time()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tier_layout_meets_the_node_link_lower_bound() {
        // 4 nodes x 2 ranks, 4 colors: each color is rooted on its own node and crosses the
        // node links nodes-1 times, so per step a node link carries 2(nodes-1) = 6 chunks
        // (one up per non-root color, three down at its own root), the bandwidth bound.
        let topo = Topology::new(4, 2);
        // Steady state (every color busy): 6 chunks leave each node per step.
        let steps = schedule(topo, 4, 10);
        let steady = steps.iter().map(|(_, c)| *c).max_by_key(|c| c.link);
        assert_eq!(steady.map(|c| c.link), Some(6));
        // Rank 0 leads colors 0 (root: its partner and three nodes) and 2 (its partner).
        assert_eq!(steps.iter().map(|(_, c)| c.adds).max(), Some(5));
        // 10 chunks, tree height H = 2: the last chunk reaches the deepest leaves at step
        // 9 + H + (H - 1) = 12, so 13 steps in all.
        assert_eq!(steps.iter().map(|(n, _)| n).sum::<usize>(), 13);
        assert!((0..4).all(|c| Tree::new(topo, 4, c).root_height == 2));
        let mut roots: Vec<usize> = (0..4)
            .map(|c| {
                let parent = parents(topo, 4, c);
                let crossings = (0..8)
                    .filter(|&r| parent[r].is_some_and(|q| topo.node_of(q) != topo.node_of(r)))
                    .count();
                assert_eq!(crossings, 3, "color {c}");
                parent.iter().position(Option::is_none).expect("root")
            })
            .collect();
        roots.sort_unstable();
        assert_eq!(roots, vec![0, 3, 4, 7]);
        // The rank-level layout over the same ranks crosses the node links more often.
        let flat: usize = (0..4)
            .map(|c| {
                (0..8)
                    .filter(|&r| {
                        parent_of(8, 4, c, r).is_some_and(|q| topo.node_of(q) != topo.node_of(r))
                    })
                    .count()
            })
            .sum();
        assert!(flat > 12, "{flat}");
        // 2 nodes x 2 ranks, 4 colors: every rank is the root of one color.
        let topo = Topology::new(2, 2);
        let mut roots: Vec<usize> = (0..4)
            .map(|c| {
                parents(topo, 4, c)
                    .iter()
                    .position(Option::is_none)
                    .expect("root")
            })
            .collect();
        roots.sort_unstable();
        assert_eq!(roots, vec![0, 1, 2, 3]);
    }
}
