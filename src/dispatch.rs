//! Kernel configurations (generated from `cpp/configs.def`) and the rules that choose one for a
//! problem, and its split-K: what [`crate::BlockScaledGemm::select_config`] and the calls apply
//! on the device they run on, here as functions of the device's facts (SM count, cluster
//! counts) for tools and tests. The types ([`Config`], [`ConfigInfo`], [`Schedule`]) are also at
//! the crate root.

use crate::error::{Error, Result};
use crate::layout::WeightLayout;
use crate::problem::{OutType, Problem};

include!(concat!(env!("OUT_DIR"), "/configs.rs"));

/// The facts of one configuration, as `cpp/configs.def` states them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigInfo {
    /// Row in the table (the C++ index).
    pub index: u32,
    /// The name in the table, also the Rust variant name.
    pub name: &'static str,
    /// GPU architecture: 100 is SM100 (B200/GB200, compute capability 10.0, `sm_100a`), 90 is
    /// SM90 (H100/H200, 9.0, `sm_90a`).
    pub arch: u32,
    /// SMs per MMA: 1, or 2 for the 2-SM UMMA.
    pub sms: u32,
    /// Tile M x N x K (for 2-SM configs, the tile of the SM pair).
    pub tile: [u32; 3],
    /// Cluster M x N.
    pub cluster: [u32; 2],
    /// The kernel family (`BSG_SM90_SCHEDULE` in the table for SM90).
    pub schedule: Schedule,
    /// Output types the table builds for this architecture.
    pub outputs: &'static [OutType],
    /// Output types of its grouped (mixture-of-experts) kernels (`BSG_GROUPED`).
    pub grouped: &'static [OutType],
    /// Output types of its list-form grouped kernels (`BSG_GROUPED_LIST`).
    pub grouped_list: &'static [OutType],
    /// Output types of its W4A16 kernels (`BSG_W4A16`), each for f16 and bf16 activations.
    pub w4a16: &'static [OutType],
}

/// How a configuration's kernel is built: its main-loop schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Schedule {
    /// SM100: CUTLASS's block-scaled UMMA kernel.
    Cutlass,
    /// SM90: both operands decoded into shared memory per CTA, SS wgmma, two CTAs per SM.
    SmemDecode,
    /// SM90, operands swapped: the weights are wgmma's register operand, the activations are
    /// decoded once per GEMM by a pre-pass into the workspace; one CTA per SM; small splits
    /// reduced through a cluster ([`cluster_split`]).
    SwappedRegisterDecode,
    /// SM90, small M (decode steps, MoE experts): the weights stream through the SM and are
    /// decoded into mma.sync fragments, the activations are decoded in the kernel (one launch, no
    /// workspace but split-K's); tile M is 8 to 32 token rows, for M up to 64.
    StreamWeights,
    /// [`Schedule::StreamWeights`] in raw stages of four k-tiles (8 and 16 token rows): for short
    /// K ranges, where the last stage's decode, which no load hides, weighs.
    StreamWeightsShortK,
}

impl ConfigInfo {
    /// SM90 with the operands swapped ([`Schedule::SwappedRegisterDecode`]).
    pub fn swapped(&self) -> bool {
        self.schedule == Schedule::SwappedRegisterDecode
    }

    /// Whether small splits of this config meet in a thread-block cluster (one CTA per SM: the
    /// swapped and the small-M schedules) rather than in global memory.
    pub fn cluster_reduces(&self) -> bool {
        self.swapped() || self.streams()
    }

    /// SM90 small M: the weights stream through the SM ([`Schedule::StreamWeights`] and its
    /// short-K stages).
    pub fn streams(&self) -> bool {
        matches!(self.schedule, Schedule::StreamWeights | Schedule::StreamWeightsShortK)
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info().name)
    }
}

impl Config {
    /// Looks a configuration up by its table name, ignoring case.
    pub fn from_name(name: &str) -> Option<Config> {
        Config::ALL.iter().copied().find(|c| c.info().name.eq_ignore_ascii_case(name))
    }

    /// Whether this build holds the kernel for this config and output (see `BSG_ARCHS` and
    /// `BSG_CONFIGS`).
    pub fn is_built(self, out: OutType) -> bool {
        let i = self.info();
        BUILT_ARCHS.contains(&i.arch) && BUILT_CONFIGS.contains(&i.name) && i.outputs.contains(&out)
    }

    /// Whether this build holds this config's grouped kernel for output `out` (`BSG_GROUPED`).
    pub fn is_built_grouped(self, out: OutType) -> bool {
        self.is_built(out) && self.info().grouped.contains(&out)
    }

    /// Whether this build holds this config's list-form grouped kernel for output `out`
    /// (`BSG_GROUPED_LIST`).
    pub fn is_built_grouped_list(self, out: OutType) -> bool {
        self.is_built(out) && self.info().grouped_list.contains(&out)
    }

    /// Whether this build holds this config's W4A16 kernels for output `out` (`BSG_W4A16`).
    pub fn is_built_w4a16(self, out: OutType) -> bool {
        self.is_built(out) && self.info().w4a16.contains(&out)
    }

    /// Whether this build holds this config's grouped W4A16 kernels for output `out` (a config
    /// that `BSG_GROUPED` and `BSG_W4A16` both list).
    pub fn is_built_grouped_w4a16(self, out: OutType) -> bool {
        self.is_built_grouped(out) && self.is_built_w4a16(out)
    }

    /// The compute capability this config's machine code runs on.
    pub const fn compute_capability(self) -> (i32, i32) {
        arch_facts(self.info().arch).0
    }

    /// "10.0 (sm_100a)" and the like, for messages.
    pub const fn arch_label(self) -> &'static str {
        arch_facts(self.info().arch).1
    }

    /// Output tiles of a problem (over all batches).
    pub fn tiles(self, p: &Problem) -> usize {
        let t = self.info().tile;
        p.m.div_ceil(t[0] as usize).saturating_mul(p.n.div_ceil(t[1] as usize)).saturating_mul(p.l)
    }

    /// SMs the launch occupies for a problem: tiles times SMs per tile.
    pub fn sms_used(self, p: &Problem) -> usize {
        self.tiles(p).saturating_mul(self.info().sms as usize)
    }
}

/// Compute capability and label of a table architecture ('a' targets run on exactly one).
const fn arch_facts(arch: u32) -> ((i32, i32), &'static str) {
    match arch {
        100 => ((10, 0), "10.0 (sm_100a)"),
        90 => ((9, 0), "9.0 (sm_90a)"),
        _ => ((0, 0), "unknown"),
    }
}

/// The architecture of this build (`BSG_ARCHS`) whose kernels run on compute capability `cc`.
pub(crate) fn built_arch(cc: (i32, i32)) -> Option<u32> {
    BUILT_ARCHS.iter().copied().find(|&a| arch_facts(a).0 == cc)
}

/// (M, N, K).
type Shape = (usize, usize, usize);

/// Benchmark shapes (the B200 contest set) with a chosen SM100 config. Chosen by tile counts on a 148-SM B200, not
/// measured (no SM100 machine here): M = 128 takes 128x64 tiles so N/64 CTAs fill more SMs;
/// M = 256 takes the 2-SM 256x128 tile (one MMA covers both rows of tiles); large M and N take
/// the 2-SM 256x256 tile.
const SM100_SHAPES: &[(Config, &[Shape])] = &[
    (Config::Sm100_1Sm_128x64x256, &[(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048), (128, 256, 256),
        (128, 1536, 7168), (128, 3072, 1536), (512, 512, 7168), (512, 1536, 7168)]),
    (Config::Sm100_2Sm_256x128x256, &[(256, 7168, 256), (256, 7168, 2048), (512, 4096, 512)]),
    (Config::Sm100_2Sm_256x256x256, &[(2304, 4608, 7168)]),
    (Config::Sm100_1Sm_128x256x256, &[(384, 7168, 2304)]),
];

/// Output tiles an SM90 split-K launch may have: its counters sit in a fixed region of the
/// workspace (`BSG_SM90_MAX_SPLIT_TILES` in the launch ABI).
pub const SM90_MAX_SPLIT_TILES: usize = crate::sys::SM90_MAX_SPLIT_TILES;

/// The K ranges a forced split-K factor gives `config` on `p`: SM100 configs ignore it (1:
/// CUTLASS schedules them); SM90 configs take at most one range per 64-K tile, at most 65535,
/// and split only outputs of at most [`SM90_MAX_SPLIT_TILES`] tiles. With prepacked weights
/// ([`crate::WeightLayout::Prepacked`]) the call also allows at most one range per 256 values of
/// K (`layout::prepack_chunks`), which this layout-free check does not know.
pub fn check_split_k(config: Config, p: &Problem, split_k: u32) -> Result<u32> {
    let i = config.info();
    if i.arch != 90 {
        return Ok(1);
    }
    let bad = |rule: String| Err(Error::InvalidData { what: "split_k", detail: format!("{split_k}: {rule}") });
    let k_tiles = p.k.div_ceil(i.tile[2] as usize);
    let max = crate::sys::SM90_MAX_SPLIT_K;
    if split_k == 0 || split_k as usize > k_tiles || split_k > max {
        return bad(format!("must be in 1..={} (K / 64 rounded up, at most {max})", k_tiles.min(max as usize)));
    }
    let tiles = config.tiles(p);
    if split_k > 1 && tiles > SM90_MAX_SPLIT_TILES {
        return bad(format!("split-K needs at most {SM90_MAX_SPLIT_TILES} output tiles, {config} gives {tiles}"));
    }
    Ok(split_k)
}

/// Splits of 2 to this many K ranges of the SM90 swapped and small-M configs
/// ([`ConfigInfo::cluster_reduces`]) can be reduced through a thread-block cluster per output
/// tile (`BSG_SM90_MAX_CLUSTER_SPLIT` in the launch ABI); [`cluster_split`] says whether a launch
/// does; other splits and tiles go through global memory.
pub const SM90_MAX_CLUSTER_SPLIT: u32 = crate::sys::SM90_MAX_CLUSTER_SPLIT;

/// Per cluster size 2 to [`SM90_MAX_CLUSTER_SPLIT`], how many clusters of that many thread
/// blocks (one block per SM) a device runs at once.
pub type ClusterCounts = [usize; SM90_MAX_CLUSTER_SPLIT as usize - 1];

/// Whether `config` can reduce a split of `split_k` ranges through a cluster of that many CTAs
/// (a launch does where the clusters also fit: [`cluster_split`]).
pub fn cluster_reduced(config: Config, split_k: u32) -> bool {
    config.info().cluster_reduces() && (2..=SM90_MAX_CLUSTER_SPLIT).contains(&split_k)
}

/// Whether a launch of `config` on `p` in `split_k` ranges reduces them through clusters: where
/// the config can ([`cluster_reduced`]) and every tile's cluster fits on the GPU at once
/// (`max_clusters`); else through global memory (a second wave of clusters cost more than the
/// global sum).
pub fn cluster_split(config: Config, p: &Problem, split_k: u32, max_clusters: &ClusterCounts) -> bool {
    cluster_reduced(config, split_k) && config.tiles(p) <= max_clusters[split_k as usize - 2]
}

/// Cluster counts that no GPU limits: for callers that do not know their device's (see
/// [`crate::gemm::DeviceFacts::max_clusters`]).
pub const ANY_CLUSTERS: ClusterCounts = [usize::MAX; SM90_MAX_CLUSTER_SPLIT as usize - 1];

/// K ranges the SM90 kernel splits `p` into (1 elsewhere), for outputs with too few tiles to
/// occupy the GPU:
/// - small-M stream tiles (one CTA per SM): as many ranges as fill the SMs, at most 32, each of
///   at least 8 k-tiles of 64; summed in global memory where their clusters would not all fit
///   ([`cluster_split`]);
/// - unswapped and swapped tiles: at most 16 ranges, each of at least 4 k-tiles;
/// - unswapped tiles (two CTAs per SM fit): two CTAs on every SM where each range keeps at least
///   28 k-tiles, else at most one CTA per SM;
/// - swapped tiles (one CTA per SM): at most one CTA per SM; a cluster split takes fewer ranges
///   until every tile's cluster fits on the GPU at once (`max_clusters`, per cluster size); a
///   split beyond a cluster's 8 ranges (only where each keeps 32 k-tiles) takes 8, then fewer
///   until the clusters fit. Either keeps the split it had, summed in global memory instead,
///   where the tile's model says that is faster for output `out` (tiles with no model of that
///   sum: where clusters of 8 do not fit).
///
/// The measurements behind each rule: bench/DESIGN.md §5 and §8.
pub fn split_k(config: Config, p: &Problem, out: OutType, sm_count: usize, max_clusters: &ClusterCounts) -> u32 {
    let i = config.info();
    if i.arch != 90 {
        return 1;
    }
    // A problem with a zero dimension has no tiles; `Problem::validate` refuses it before any
    // launch, and the rule answers for it as for one tile.
    let tiles = config.tiles(p).max(1);
    let k_tiles = p.k.div_ceil(i.tile[2] as usize);
    if i.streams() {
        // One CTA per SM: as many ranges as fit, each of at least 8 k-tiles (one raw stage of
        // eight k-tiles, two of four).
        return (sm_count / tiles).min(k_tiles / 8).clamp(1, STREAM_MAX_SPLIT) as u32;
    }
    let ranges = |ctas: usize| (ctas / tiles).min(k_tiles / 4).clamp(1, 16);
    if !i.swapped() {
        let two = ranges(sm_count.saturating_mul(2));
        return if k_tiles / two >= 28 { two } else { ranges(sm_count) } as u32;
    }
    let mut unlowered = ranges(sm_count) as u32;
    if unlowered > SM90_MAX_CLUSTER_SPLIT && k_tiles / (unlowered as usize) < 32 {
        unlowered = SM90_MAX_CLUSTER_SPLIT;
    }
    let mut split = unlowered.min(SM90_MAX_CLUSTER_SPLIT);
    while cluster_reduced(config, split) && tiles > max_clusters[split as usize - 2] {
        split -= 1;
    }
    // Beyond a cluster's ranges, or held down by the clusters that fit: the split as it was,
    // summed through global memory, where the model says that is faster than the split the
    // clusters sum. Tiles without a fitted global sum keep the latter, but for a split beyond 8
    // only where clusters of 8 fit (the one comparison measured, bench/DESIGN.md §8).
    if split < unlowered {
        let faster = match global_sum_us(config, unlowered, out) {
            Some(global) => swapped_model_us(config, p, sm_count, unlowered, Some(global)) < swapped_model_us(config, p, sm_count, split, None),
            None => unlowered > SM90_MAX_CLUSTER_SPLIT && split < SM90_MAX_CLUSTER_SPLIT,
        };
        if faster {
            return unlowered;
        }
    }
    split
}

/// With prepacked weights ([`WeightLayout::Prepacked`]) the 128-wide stream tiles run their
/// short-K stages at any K range where the launch is one wave (tiles x split at most the SMs):
/// their contiguous boxes then favour the finer stages, which the standard layout's row-strided
/// ones do not (bench/DESIGN.md §12; across two waves the long stages still win). `config` as
/// the rule chose it for the standard layout and output `out`.
pub fn for_weights(config: Config, layout: WeightLayout, p: &Problem, out: OutType, sm_count: usize, max_clusters: &ClusterCounts, available: impl Fn(Config) -> bool) -> Config {
    let short = match config {
        Config::Sm90_Stream_8x128x64 => Config::Sm90_StreamShortK_8x128x64,
        Config::Sm90_Stream_16x128x64 => Config::Sm90_StreamShortK_16x128x64,
        _ => return config,
    };
    let one_wave = config.tiles(p) * split_k(config, p, out, sm_count, max_clusters) as usize <= sm_count;
    if layout == WeightLayout::Prepacked && one_wave && available(short) { short } else { config }
}

/// Token rows the stream tiles serve at most.
const STREAM_MAX_M: usize = 64;

/// K ranges of a small-M (stream) launch at most.
const STREAM_MAX_SPLIT: usize = 32;

/// K ranges of at most this many k-tiles take the stream tiles' short-K stages (bench/DESIGN.md
/// §12: ranges of 14 to 28 k-tiles gain, 64 and 128 lose).
const STREAM_SHORT_K: usize = 32;

/// A narrower stream tile of 8 or 16 rows with fewer CTAs than the widest still wins where it
/// splits K into ranges of at most this many k-tiles (bench/DESIGN.md §12: ranges of 22 to 56
/// k-tiles gain; whole ranges of 432 lose).
const STREAM_FEWER_CTAS_K: usize = 128;

/// The 32-wide stream tiles only where each CTA's K range is at most this many k-tiles: each
/// CTA decodes its tokens' activations over its whole range for 32 weight rows, half the
/// 64-wide tile's weights a decoded activation (bench/DESIGN.md §12: ranges of 8 to 56 k-tiles
/// gained 2-14 %, 64 lost 5 % or tied, 96 to 128 lost up to 10 %).
const STREAM_NARROW_K: usize = 56;

/// Modelled time (microseconds, H100 SXM) of a swapped tile on `p` at the split the rule gives
/// it for output `out` ([`split_k`]): per wave, the fixed costs (first raw stage; after the loop
/// the cluster reduction, the global sum of a split beyond a cluster's ranges or one the
/// clusters that fit would have lowered ([`global_sum_us`]), or the epilogue) plus one K
/// range's k-tiles at the loop's rate in clocks at 1.9 GHz. The constants of the 128-row tiles
/// are measured per tile (timelines and traces, bench/DESIGN.md §8); 256x128's after-loop cost at
/// split-K is fitted to same-run comparisons with the 128x128 (§8); the 64-row tiles' are fitted
/// to graph-replayed times of both at five shapes (§12).
fn swapped_estimate_us(config: Config, p: &Problem, out: OutType, sm_count: usize, max_clusters: &ClusterCounts) -> f64 {
    let split = split_k(config, p, out, sm_count, max_clusters);
    // A split beyond a cluster's ranges, or one the clusters that fit would have lowered, taken
    // whole through global memory.
    let global = split > 1 && !cluster_split(config, p, split, max_clusters);
    swapped_model_us(config, p, sm_count, split, if global { global_sum_us(config, split, out) } else { None })
}

/// [`swapped_estimate_us`] at `split` ranges, with `after` the after-loop cost where given (else
/// the cluster sum's, or at split 1 the epilogue's).
fn swapped_model_us(config: Config, p: &Problem, sm_count: usize, split: u32, after: Option<f64>) -> f64 {
    let (first, reduce, clocks) = match config {
        Config::Sm90_Swapped_128x128x64 => (2.2, 4.3, 677.0),
        Config::Sm90_256x128x64 => (2.2, 6.4, 1190.0),
        // The cluster sum of 64x128 grows from split 6 (5.4-6.0 us fitted at splits 6 and 8).
        Config::Sm90_Swapped_64x128x64 => (1.5, if split <= 5 { 4.5 } else { 5.7 }, 579.0),
        Config::Sm90_Swapped_64x256x64 => (2.5, 5.5, 986.0),
        _ => (2.9, 6.1, 1220.0),
    };
    let after = after.unwrap_or(if split > 1 { reduce } else { 2.5 });
    let ctas = config.tiles(p) * split as usize;
    let waves = ctas.div_ceil(sm_count.max(1)) as f64;
    let range = p.k.div_ceil(64).div_ceil(split.max(1) as usize) as f64;
    waves * (first + after + range * clocks / 1900.0)
}

/// After-loop cost (us) of summing `split` ranges of `config` through global memory instead of a
/// cluster: fitted per size of partial tile to same-run comparisons of both sums at shapes of
/// the 64-row tiles and the swapped 128x128, for one round of partial loads (the last CTA loads
/// four partials at a time: split 4 at most) and for two, each further round costing what the
/// second did (bench/DESIGN.md §8; checked at split 16). FP4 output adds the encode of the whole
/// tile in that last CTA, which a cluster shares out: fitted for 64x128 (1.0 us; not for the
/// 64 KiB tiles, whose comparisons the model already misses by as much). None for the tiles
/// with larger partials (no fit; the rule keeps their cluster split where those fit).
fn global_sum_us(config: Config, split: u32, out: OutType) -> Option<f64> {
    let [one, two, fp4] = match config {
        Config::Sm90_Swapped_64x128x64 => [7.0, 8.2, 1.0],
        Config::Sm90_Swapped_128x128x64 | Config::Sm90_Swapped_64x256x64 => [9.7, 11.1, 0.0],
        _ => return None,
    };
    let encode = if out.sfd().is_some() { fp4 } else { 0.0 };
    Some(one + f64::from(split.div_ceil(4).max(1) - 1) * (two - one) + encode)
}

/// The grouped (mixture-of-experts) kernel for `rows` stacked rows over `experts` experts. SM100:
/// the config with grouped kernels for `out`. SM90: by
/// the mean rows per expert `ceil(T / min(E, T))` (the routing is on the device, so the mean is
/// all the host knows), among the configs with a grouped kernel for `out` that `available`
/// allows: from GROUPED_SWAPPED_MEAN rows the swapped 128-row tiles (the 128x128 one, else
/// 128x256); below, the stream tile of the fewest rows that holds the mean (up to
/// GROUPED_SHORT_K_MAX_MEAN where K is at most STREAM_SHORT_K k-tiles, GROUPED_LONG_K_MAX_MEAN
/// elsewhere), else the tallest, in its short-K
/// stages where K is at most STREAM_SHORT_K k-tiles and it has them (the 32-row tile has long
/// stages only; each work item spans the whole K).
pub fn select_grouped(arch: u32, rows: usize, experts: usize, k: usize, out: OutType, available: impl Fn(Config) -> bool) -> Option<Config> {
    select_grouped_in(|i| i.grouped, arch, rows, experts, k, out, available)
}

/// The list-form grouped GEMM's config (SM100: its one config with list kernels, as
/// [`select_grouped`]; SM90: the rule of [`select_grouped`] over the list kernels), with the mean rows a group from the host's
/// bounds, `ceil(max_rows / min(groups, max_rows))` (the largest group's M where the sum of M is
/// bounded by groups times it), and the largest K.
pub fn select_grouped_list(arch: u32, max_rows: usize, groups: usize, max_k: usize, out: OutType, available: impl Fn(Config) -> bool) -> Option<Config> {
    select_grouped_in(|i| i.grouped_list, arch, max_rows, groups, max_k, out, available)
}

fn select_grouped_in(table: fn(&ConfigInfo) -> &'static [OutType], arch: u32, rows: usize, experts: usize, k: usize, out: OutType, available: impl Fn(Config) -> bool) -> Option<Config> {
    let all: Vec<Config> = Config::ALL.iter().copied().filter(|c| c.info().arch == arch && table(&c.info()).contains(&out) && available(*c)).collect();
    if arch == 100 {
        // CUTLASS's pointer-array kernel: one config of the table has grouped kernels.
        return all.first().copied();
    }
    let mean = rows.div_ceil(experts.min(rows).max(1));
    if mean >= GROUPED_SWAPPED_MEAN {
        if let Some(c) = [Config::Sm90_Swapped_128x128x64, Config::Sm90_128x256x64].into_iter().find(|c| all.contains(c)) {
            return Some(c);
        }
    }
    let candidates: Vec<Config> = all.into_iter().filter(|c| c.info().streams()).collect();
    let tile_rows = |c: &Config| c.info().tile[0] as usize;
    let short = k.div_ceil(64) <= STREAM_SHORT_K;
    let max_means: &[(usize, usize)] = if short { &GROUPED_SHORT_K_MAX_MEAN } else { &GROUPED_LONG_K_MAX_MEAN };
    let max_mean = |r: usize| max_means.iter().find(|&&(t, _)| t == r).map_or(r, |&(_, m)| m);
    let rows_pick = candidates.iter().map(tile_rows).filter(|&r| max_mean(r) >= mean).min().or_else(|| candidates.iter().map(tile_rows).max())?;
    let fewest: Vec<Config> = candidates.into_iter().filter(|c| tile_rows(c) == rows_pick).collect();
    fewest.iter().copied().find(|c| (c.info().schedule == Schedule::StreamWeightsShortK) == short).or(fewest.first().copied())
}

/// At K of at most STREAM_SHORT_K k-tiles, the largest mean rows an expert that the 8- and 16-row
/// stream tiles take (a taller tile takes larger ones): top-k routing spreads the experts' rows
/// around the mean, and an expert's second m-tile decodes its weights again and pays a short
/// item's fixed costs again, so the taller tile wins from a mean of 7 and 16 rows (bench/DESIGN.md
/// §14: the next taller tile lost at means 5-6 and 10-15, won at 7-8 and 16).
const GROUPED_SHORT_K_MAX_MEAN: [(usize, usize); 2] = [(8, 6), (16, 15)];

/// The same at long K: the 8-row tile up to a mean of 5 (the 16-row one lost at 5 and won at 6-8,
/// bench/DESIGN.md §14); the 16- and 32-row tiles up to their rows (the 32-row one lost at
/// 10-16).
const GROUPED_LONG_K_MAX_MEAN: [(usize, usize); 1] = [(8, 5)];

/// Mean rows per expert from which the grouped GEMM takes the swapped tiles: where no stream tile
/// holds the mean. Above 32 rows the 32-row stream tile decodes most experts' weights twice, the
/// swapped tile once; since the swapped kernels read the walk over the experts their pre-pass
/// stores, the 32-row tile tied at a mean of 33 (long K) and lost from 34 (bench/DESIGN.md §14).
const GROUPED_SWAPPED_MEAN: usize = 33;

/// Picks a configuration of architecture `arch` for `p`, among those `available` says are
/// built: on SM90 at M <= 64 the stream tile of the fewest rows that holds M (else the tallest),
/// or at 33 to 64 rows a swapped 64-row tile (64x128, or 64x256 where the swapped tiles' time
/// model (bench/DESIGN.md §8) finds it faster) where the stream tiles' K ranges are long or
/// their CTAs need two waves; above 64 rows on SM90 a swapped tile (256x128 where M pads little
/// more than to 128 rows, else 128x256, or the swapped 128x128 where that model finds it faster)
/// once its CTAs with split-K occupy a third of the SMs, else the unswapped 128x128; the
/// explicit entry of the shape table if it has one (SM100); else the largest tile that still
/// gives every SM a tile (`sm_count`), else the config that occupies the most SMs (ties: the
/// least padded work). `out` weighs the splits the swapped tiles' model compares
/// ([`split_k`]). `None` when no config of that architecture is available.
pub fn select(arch: u32, p: &Problem, out: OutType, sm_count: usize, max_clusters: &ClusterCounts, available: impl Fn(Config) -> bool) -> Option<Config> {
    let candidates: Vec<Config> = Config::ALL.iter().copied().filter(|c| c.info().arch == arch && available(*c)).collect();
    if arch == 100 {
        if let Some((c, _)) = SM100_SHAPES.iter().find(|(c, shapes)| shapes.contains(&(p.m, p.n, p.k)) && candidates.contains(c)) {
            return Some(*c);
        }
    }
    if arch == 90 {
        // Small M (at most 64 token rows): the stream tile of the fewest rows that holds M, else
        // the tallest (M = 33 to 64: two 32-row tiles, measured faster than one 64-row stream
        // tile; a swapped 64-row tile may still take it below); in
        // stages of four k-tiles where each CTA's K range is at most STREAM_SHORT_K k-tiles.
        let stream = candidates.iter().copied().filter(|c| c.info().streams() && p.m <= STREAM_MAX_M);
        let tile_rows = |c: Config| c.info().tile[0] as usize;
        let holding = stream.clone().map(tile_rows).filter(|&r| r >= p.m).min();
        if let Some(rows) = holding.or_else(|| stream.clone().map(tile_rows).max()) {
            // Each CTA's K ranges: `split` of them, `range` k-tiles of 64 each.
            let split = |c: Config| split_k(c, p, out, sm_count, max_clusters) as usize;
            let range = |c: Config| p.k.div_ceil(64).div_ceil(split(c));
            let short = |c: Config| range(c) <= STREAM_SHORT_K;
            let want = |c: &Config| (c.info().schedule == Schedule::StreamWeightsShortK) == short(*c);
            let fewest: Vec<Config> = stream.filter(|&c| tile_rows(c) == rows).collect();
            // Per width (32, 64 or 128 weight rows), the schedule the K range asks for, else the
            // one built; then the narrowest whose CTAs (tiles x split) fit one wave and are at
            // least the widest's (at the same CTAs it runs a fraction of the split: a cluster sum
            // where the wider one sums through global memory, or none), or (8 and 16 rows) fewer
            // CTAs still splitting K into ranges of at most STREAM_FEWER_CTAS_K k-tiles (short
            // streams, where the wider tile's larger split-K sum and fixed costs outweigh the SMs
            // left idle; at split 1 W4A16's bf16 range test reads each CTA's whole K); at 32 rows
            // only where its K ranges are short (each CTA decodes its activations over its whole
            // range); 32 wide only where its K ranges are at most STREAM_NARROW_K k-tiles (the
            // same reason). Else the widest.
            let width = |c: &Config| c.info().tile[1];
            let mut widths: Vec<u32> = fewest.iter().map(width).collect();
            widths.sort_unstable();
            widths.dedup();
            let per_width: Vec<Config> = widths
                .into_iter()
                .filter_map(|w| {
                    let mut same = fewest.iter().copied().filter(|c| width(c) == w);
                    same.clone().find(want).or_else(|| same.next())
                })
                .collect();
            let ctas = |c: &Config| c.tiles(p).saturating_mul(split(*c));
            let widest = per_width.last().copied()?;
            let short_enough = |c: &Config| tile_rows(*c) < 32 || short(*c);
            let short_split = |c: &Config| split(*c) >= 2 && range(*c) <= STREAM_FEWER_CTAS_K;
            let enough_ctas = |c: &Config| ctas(c) >= ctas(&widest) || (tile_rows(*c) < 32 && short_split(c));
            let narrow_enough = |c: &Config| width(c) > 32 || range(*c) <= STREAM_NARROW_K;
            let pick = per_width.iter().copied().find(|c| ctas(c) <= sm_count && enough_ctas(c) && short_enough(c) && narrow_enough(c)).unwrap_or(widest);
            // 33 to 64 rows: two 32-row stream tiles decode every weight twice; the swapped 64-row
            // tiles decode it once, and win unless the stream tiles' K ranges are short and their
            // CTAs fit one wave (there the swapped tile's fixed costs weigh). Of the two, 64x256
            // (the activations loaded once for twice the weights, half the tiles) where
            // swapped_estimate_us models it faster (its better loop rate over each CTA's K range
            // against its larger fixed costs and, at half the tiles, larger splits: e.g. long K,
            // or 64x128 tiles beyond one wave or at a small split);
            // ties keep 64x128.
            if p.m > 32 && !(short(pick) && ctas(&pick) <= sm_count) {
                let est = |c: &Config| swapped_estimate_us(*c, p, out, sm_count, max_clusters);
                let swapped64 = [Config::Sm90_Swapped_64x128x64, Config::Sm90_Swapped_64x256x64].into_iter().filter(|c| candidates.contains(c));
                if let Some(c) = swapped64.min_by(|a, b| est(a).total_cmp(&est(b))) {
                    return Some(c);
                }
            }
            return Some(pick);
        }
        // Split-K fills the GPU for small outputs, so the choice is about tile efficiency
        // (evidence: bench/DESIGN.md §8):
        // - a swapped tile once its CTAs, split-K included, occupy a third of the SMs, else the
        //   unswapped 128x128 (two CTAs per SM);
        // - of the swapped tiles, 256x128 (twice the MMA work per decoded weight) wherever M pads
        //   at most a tenth more with 256-row tiles, else 128x256;
        // - the swapped 128x128 stands in for either where swapped_estimate_us says it is faster
        //   (short K ranges, where the fixed costs weigh, or more CTAs: 64 tiles at split 2
        //   where the wide tile's 32 are held to split 3 by the clusters that fit).
        let pad = |rows: usize| p.m.div_ceil(rows).saturating_mul(rows);
        let mut swapped = [Config::Sm90_256x128x64, Config::Sm90_128x256x64]
            .into_iter()
            .filter(|c| candidates.contains(c))
            .find(|&c| c == Config::Sm90_128x256x64 || pad(256).saturating_mul(10) <= pad(128).saturating_mul(11));
        let narrow = Config::Sm90_Swapped_128x128x64;
        if let Some(wide) = swapped.filter(|_| candidates.contains(&narrow)) {
            if swapped_estimate_us(narrow, p, out, sm_count, max_clusters) < swapped_estimate_us(wide, p, out, sm_count, max_clusters) {
                swapped = Some(narrow);
            }
        }
        if let Some(s) = swapped.filter(|&s| s.tiles(p).saturating_mul(split_k(s, p, out, sm_count, max_clusters) as usize).saturating_mul(3) >= sm_count) {
            return Some(s);
        }
        if candidates.contains(&Config::Sm90_128x128x64) {
            return Some(Config::Sm90_128x128x64);
        }
    }
    // The stream tiles serve only the M their rows hold, taken above (partial builds may leave
    // nothing else here).
    let candidates: Vec<Config> = candidates.into_iter().filter(|c| !c.info().streams()).collect();
    let area = |c: &Config| c.info().tile[0] as usize * c.info().tile[1] as usize;
    let padded = |c: &Config| {
        let t = c.info().tile;
        p.m.div_ceil(t[0] as usize).saturating_mul(t[0] as usize).saturating_mul(p.n.div_ceil(t[1] as usize).saturating_mul(t[1] as usize))
    };
    let filling = candidates.iter().filter(|c| c.sms_used(p) >= sm_count).max_by_key(|c| (area(c), std::cmp::Reverse(padded(c))));
    filling.or_else(|| candidates.iter().max_by_key(|c| (c.sms_used(p), std::cmp::Reverse(padded(c))))).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuOccupancyMaxActiveClusters per cluster size 2 to 8, H100 SXM, one CTA per SM.
    const H100_CLUSTERS: ClusterCounts = [66, 39, 30, 22, 17, 15, 15];

    #[test]
    fn grouped_picks_by_mean_rows_per_expert() {
        let all = |_| true;
        // DeepSeek-V3 decode, 8 tokens x top-8 over 256 experts: about one row per expert hit.
        assert_eq!(select_grouped(90, 64, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_8x128x64));
        assert_eq!(select_grouped(90, 64, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_StreamShortK_8x128x64));
        assert_eq!(select_grouped(90, 120, 8, 7168, OutType::F16, all), Some(Config::Sm90_Stream_16x128x64));
        // No short-K stages of 32 rows: the 32-row tile as it is.
        assert_eq!(select_grouped(90, 4096, 128, 2048, OutType::F32, all), Some(Config::Sm90_Stream_32x128x64));
        // At short K the 8-row tile up to a mean of 6 rows, the 16-row up to 15 (256 experts, K =
        // 2048: means 6, 7, 15, 16 and 32); at long K the 8-row tile up to 5, the 16-row up to 16
        // (K = 7168: means 5, 6, 16 and 17).
        assert_eq!(select_grouped(90, 1536, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_StreamShortK_8x128x64));
        assert_eq!(select_grouped(90, 1537, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_StreamShortK_16x128x64));
        assert_eq!(select_grouped(90, 3840, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_StreamShortK_16x128x64));
        assert_eq!(select_grouped(90, 3841, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_Stream_32x128x64));
        assert_eq!(select_grouped(90, 8192, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_Stream_32x128x64));
        assert_eq!(select_grouped(90, 4096, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_16x128x64));
        assert_eq!(select_grouped(90, 4097, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_32x128x64));
        assert_eq!(select_grouped(90, 1280, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_8x128x64));
        assert_eq!(select_grouped(90, 1281, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_16x128x64));
        assert_eq!(select_grouped(90, 2048, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_16x128x64));
        // From 33 rows per expert, the swapped 128-row tiles, at any K.
        assert_eq!(select_grouped(90, 1024, 8, 7168, OutType::Bf16, all), Some(Config::Sm90_Swapped_128x128x64));
        assert_eq!(select_grouped(90, 1024, 8, 7168, OutType::Bf16, |c| c != Config::Sm90_Swapped_128x128x64), Some(Config::Sm90_128x256x64));
        assert_eq!(select_grouped(90, 32 * 256, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Stream_32x128x64));
        assert_eq!(select_grouped(90, 32 * 256 + 1, 256, 7168, OutType::Bf16, all), Some(Config::Sm90_Swapped_128x128x64));
        assert_eq!(select_grouped(90, 32 * 256 + 1, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_Swapped_128x128x64));
        assert_eq!(select_grouped(90, 32 * 256, 256, 2048, OutType::Bf16, all), Some(Config::Sm90_Stream_32x128x64));
        assert_eq!(select_grouped(90, 40, 8, 7168, OutType::Nvfp4, all), Some(Config::Sm90_Stream_8x128x64));
        assert_eq!(select_grouped(90, 1024, 8, 7168, OutType::Nvfp4Ue8m0, all), Some(Config::Sm90_Swapped_128x128x64));
        assert_eq!(select_grouped(100, 64, 8, 7168, OutType::Nvfp4, all), Some(Config::Sm100_1Sm_128x128x256));
        assert_eq!(select_grouped(100, 64, 8, 7168, OutType::F16, all), Some(Config::Sm100_1Sm_128x128x256));
        assert_eq!(select_grouped(100, 64, 8, 7168, OutType::F32, all), None);
        assert_eq!(select_grouped(100, 64, 8, 7168, OutType::F16, |c| c.info().arch != 100), None);
        assert_eq!(select_grouped(90, 64, 256, 7168, OutType::Bf16, |c| c != Config::Sm90_Stream_8x128x64), Some(Config::Sm90_StreamShortK_8x128x64));
        // The list form: the same rule over its kernels, the mean from the host's bounds (Qwen3
        // t64: 512 rows over 123 groups, K 2048); on SM100 its one list-kernel config, f16 out.
        assert_eq!(select_grouped_list(90, 512, 123, 2048, OutType::Bf16, all), Some(Config::Sm90_StreamShortK_8x128x64));
        assert_eq!(select_grouped_list(90, 1024, 8, 7168, OutType::Nvfp4, all), Some(Config::Sm90_Swapped_128x128x64));
        assert_eq!(select_grouped_list(90, 0, 3, 64, OutType::F32, all), Some(Config::Sm90_StreamShortK_8x128x64));
        assert_eq!(select_grouped_list(100, 64, 8, 7168, OutType::F16, all), Some(Config::Sm100_1Sm_128x128x256));
        assert_eq!(select_grouped_list(100, 64, 8, 7168, OutType::F32, all), None);
        for c in Config::ALL {
            if !c.info().grouped_list.is_empty() {
                // SM90: every output of the MoE form's configs; SM100: the MoE form's outputs
                // (build.rs puts both forms in one translation unit).
                let (g, l) = (c.info().grouped, c.info().grouped_list);
                assert!(if c.info().arch == 90 { g.iter().all(|o| l.contains(o)) } else { l.iter().all(|o| g.contains(o)) }, "{c}: list kernels and the MoE form's");
            }
        }
        for c in Config::ALL {
            if !c.info().grouped.is_empty() {
                assert!(c.info().arch == 100 || c.info().streams() || (c.info().swapped() && c.info().tile[0] == 128), "{c}: grouped SM90 kernels are built on the stream and swapped 128-row tiles");
            }
        }
    }

    #[test]
    fn built_arch_is_the_exact_compute_capability() {
        for &a in BUILT_ARCHS {
            assert_eq!(built_arch(arch_facts(a).0), Some(a));
        }
        // sm_90a and sm_100a cubins run on 9.0 and 10.0 only.
        for cc in [(8, 0), (8, 9), (9, 1), (10, 3), (12, 0)] {
            assert_eq!(built_arch(cc), None, "{cc:?}");
        }
    }

    #[test]
    fn table_facts() {
        assert!(Config::ALL.len() >= 5);
        for (i, c) in Config::ALL.iter().enumerate() {
            let info = c.info();
            assert_eq!(info.index as usize, i);
            assert_eq!(Config::from_name(&info.name.to_uppercase()), Some(*c));
            assert!(info.sms == 1 || info.sms == 2);
            if info.sms == 2 {
                assert_eq!(info.cluster[0] % 2, 0, "{c}: 2-SM configs need an even cluster M");
                assert_eq!(info.tile[0], 256);
            } else if *c == Config::Sm90_256x128x64 {
                assert_eq!(info.tile, [256, 128, 64]);
            } else if *c == Config::Sm90_Swapped_64x128x64 {
                assert_eq!(info.tile, [64, 128, 64]);
            } else if *c == Config::Sm90_Swapped_64x256x64 {
                assert_eq!(info.tile, [64, 256, 64]);
            } else if info.streams() {
                // What the stream Tile static_asserts: 8 to 64 token rows, the summed tile's
                // float4 units whole per thread or fewer than the 256 threads; and the table's
                // choice: short-K stages for 8 and 16 rows only (measured there).
                assert!(info.arch == 90 && [8, 16, 32, 64].contains(&info.tile[0]) && [32, 64, 128].contains(&info.tile[1]), "{c}");
                let units = info.tile[0] * info.tile[1] / 4;
                assert!(units % 256 == 0 || units < 256, "{c}");
                // The grouped rule picks among the stream tiles by rows alone: only the 128-wide
                // ones have grouped kernels.
                assert!(info.tile[1] == 128 || (info.grouped.is_empty() && info.grouped_list.is_empty()), "{c}");
                assert!(info.schedule == Schedule::StreamWeights || info.tile[0] <= 16, "{c}");
            } else {
                assert_eq!(info.tile[0], 128);
            }
            let k_tile = if info.arch == 100 { 256 } else { 64 };
            assert_eq!(info.tile[2], k_tile, "{c}: K tile");
            // What the SM90 kernel's Tile static_asserts, checked here on the table: 128x256,
            // 256x128, 64x128 and 64x256 exist only swapped, 128x64 only not, 128x128 both ways.
            let t = [info.tile[0], info.tile[1]];
            if info.swapped() {
                assert!(info.arch == 90 && [[128, 256], [256, 128], [128, 128], [64, 128], [64, 256]].contains(&t), "{c}");
            } else if info.schedule == Schedule::SmemDecode {
                assert!(info.arch == 90 && [[128, 64], [128, 128]].contains(&t), "{c}");
            }
        }
        assert!(Config::Sm90_Swapped_128x128x64.info().swapped() && !Config::Sm90_128x128x64.info().swapped());
        assert_eq!(Config::from_name("nope"), None);
    }

    #[test]
    fn split_k_fills_the_gpu_only_when_needed() {
        let c = Config::Sm90_128x128x64;
        assert_eq!(split_k(c, &Problem::new(128, 7168, 16384), OutType::F16, 132, &ANY_CLUSTERS), 4); // 56 tiles, 264 slots
        assert_eq!(split_k(c, &Problem::new(128, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 4); // 32 tiles: 8 ranges would be 14 k-tiles
        assert_eq!(split_k(c, &Problem::new(128, 7168, 2048), OutType::F16, 132, &ANY_CLUSTERS), 2); // 4 ranges would be 8 k-tiles
        assert_eq!(split_k(c, &Problem::new(256, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 4); // 64 tiles, 28 k-tiles a range
        assert_eq!(split_k(c, &Problem::new(128, 2048, 7168), OutType::F16, 132, &ANY_CLUSTERS), 8); // 16 tiles, one CTA per SM
        // 128x256: a cluster's 8 ranges at most, unless every range keeps 32 k-tiles.
        assert_eq!(split_k(Config::Sm90_128x256x64, &Problem::new(512, 1536, 7168), OutType::F16, 132, &ANY_CLUSTERS), 5);
        assert_eq!(split_k(Config::Sm90_128x256x64, &Problem::new(128, 2048, 7168), OutType::F16, 132, &ANY_CLUSTERS), 8);
        assert_eq!(split_k(Config::Sm90_128x256x64, &Problem::new(128, 4096, 16384), OutType::F16, 132, &ANY_CLUSTERS), 8);
        assert_eq!(split_k(c, &Problem::new(128, 256, 256), OutType::F16, 132, &ANY_CLUSTERS), 1); // only 4 k-tiles
        assert_eq!(split_k(c, &Problem::new(2048, 2048, 2048), OutType::F16, 132, &ANY_CLUSTERS), 1); // 256 tiles
        // 256x128: one CTA per SM, as 128x256.
        let tall = Config::Sm90_256x128x64;
        assert_eq!(split_k(tall, &Problem::new(2048, 2048, 2048), OutType::F16, 132, &ANY_CLUSTERS), 1); // 128 tiles
        assert_eq!(split_k(tall, &Problem::new(512, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 2); // 64 tiles
        assert!(cluster_reduced(tall, 2) && cluster_reduced(tall, SM90_MAX_CLUSTER_SPLIT));
        assert_eq!(split_k(Config::Sm100_1Sm_128x64x256, &Problem::new(128, 4096, 7168), OutType::F16, 148, &ANY_CLUSTERS), 1);
        for &(m, n, k) in &[(1, 8, 32), (128, 8, 64 * 200), (4096, 8, 32)] {
            let s = split_k(c, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS) as usize;
            assert!(s >= 1 && s <= k.div_ceil(64), "{m}x{n}x{k}: {s}");
        }
    }

    #[test]
    fn split_k_clusters_stay_within_one_wave() {
        let wide = Config::Sm90_128x256x64;
        let all = |_| true;
        // 28 tiles: clusters of 4 fit (30), the 128x256 tile splits 4 ways.
        assert_eq!(split_k(wide, &Problem::new(128, 7168, 16384), OutType::F16, 132, &H100_CLUSTERS), 4);
        assert_eq!(select(90, &Problem::new(128, 7168, 16384), OutType::F16, 132, &H100_CLUSTERS, all), Some(wide));
        // 32 tiles: 32 clusters of 4 do not fit, 32 of 3 do, and the swapped tile keeps the
        // lowered split; at M = 1024 and 256 that is 256x128, whose 32 tiles split alike.
        let tall = Config::Sm90_256x128x64;
        let no_narrow = |c: Config| c != Config::Sm90_Swapped_128x128x64;
        for (p, c) in [(Problem::new(1024, 1024, 8192), tall), (Problem::new(128, 8192, 16384), wide), (Problem::new(256, 4096, 7168), tall)] {
            for t in [wide, c] {
                assert_eq!(split_k(t, &p, OutType::F16, 132, &H100_CLUSTERS), 3, "{p:?} {t}");
                assert_eq!(split_k(t, &p, OutType::F16, 132, &ANY_CLUSTERS), 4, "{p:?} {t}");
            }
            assert_eq!(select(90, &p, OutType::F16, 132, &H100_CLUSTERS, no_narrow), Some(c), "{p:?}");
            assert_eq!(select(90, &p, OutType::F16, 132, &ANY_CLUSTERS, no_narrow), Some(c), "{p:?}");
        }
        // The swapped 128x128 tile: 64 tiles, clusters of 2 fit (66). Where 128x256 is held to
        // split 3 (96 CTAs), it is the faster; with 128x256 at split 4 (no cluster limit) the
        // model keeps 128x256.
        let narrow = Config::Sm90_Swapped_128x128x64;
        assert_eq!(split_k(narrow, &Problem::new(128, 8192, 16384), OutType::F16, 132, &H100_CLUSTERS), 2);
        assert_eq!(select(90, &Problem::new(128, 8192, 16384), OutType::F16, 132, &H100_CLUSTERS, all), Some(narrow));
        assert_eq!(select(90, &Problem::new(128, 8192, 16384), OutType::F16, 132, &ANY_CLUSTERS, all), Some(wide));
        // 32 tiles at 128x4096x7168: clusters of 4 do not fit (30), of 3 do.
        assert_eq!(split_k(narrow, &Problem::new(128, 4096, 7168), OutType::F16, 132, &H100_CLUSTERS), 3);
        assert_eq!(split_k(narrow, &Problem::new(128, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 4);
        assert_eq!(select(90, &Problem::new(128, 4096, 7168), OutType::F16, 132, &H100_CLUSTERS, all), Some(narrow));
        assert!(cluster_reduced(narrow, 2) && !cluster_reduced(narrow, 1));
        // 40 tiles: clusters of 3 do not fit either (39), of 2 do, and 128x256 at split 2 is
        // still the faster.
        assert_eq!(split_k(wide, &Problem::new(128, 10240, 8192), OutType::F16, 132, &H100_CLUSTERS), 2);
        assert_eq!(select(90, &Problem::new(128, 10240, 8192), OutType::F16, 132, &H100_CLUSTERS, all), Some(wide));
        assert_eq!(select(90, &Problem::new(128, 10240, 8192), OutType::F16, 132, &ANY_CLUSTERS, all), Some(wide)); // also against 128x128 swapped (80 tiles, no split)
        // 16 tiles: 15 clusters of 8 or 7 fit, 17 of 6; 24 tiles: 22 of 5, 30 of 4; 8 tiles: all
        // 8 ranges.
        for (p, s) in [(Problem::new(128, 4096, 7168), 6), (Problem::new(128, 4096, 16384), 6), (Problem::new(512, 1536, 7168), 4), (Problem::new(128, 2048, 7168), 8)] {
            assert_eq!(split_k(wide, &p, OutType::F16, 132, &H100_CLUSTERS), s, "{p:?}");
        }
        // No cluster fits: no cluster split. Splits through global memory and other tiles are
        // not limited.
        assert_eq!(split_k(wide, &Problem::new(128, 7168, 16384), OutType::F16, 132, &[0; 7]), 1);
        assert_eq!(split_k(wide, &Problem::new(128, 2048, 65536), OutType::F16, 132, &[0; 7]), 16); // 8 tiles, 64 k-tiles a range
        assert_eq!(split_k(Config::Sm90_128x128x64, &Problem::new(128, 7168, 16384), OutType::F16, 132, &[0; 7]), 4);
        assert!(cluster_reduced(wide, 2) && cluster_reduced(wide, SM90_MAX_CLUSTER_SPLIT));
        assert!(!cluster_reduced(wide, 1) && !cluster_reduced(wide, SM90_MAX_CLUSTER_SPLIT + 1));
        assert!(!cluster_reduced(Config::Sm90_128x128x64, 2));
    }

    #[test]
    fn small_m_takes_the_stream_tiles() {
        let all = |_| true;
        // The 128-wide tiles alone first (the 64- and 32-wide ones below).
        let wide = |c: Config| !c.info().streams() || c.info().tile[1] == 128;
        let s8 = Config::Sm90_Stream_8x128x64;
        let (short8, short16) = (Config::Sm90_StreamShortK_8x128x64, Config::Sm90_StreamShortK_16x128x64);
        // At N x K = 4096 x 7168 each CTA's range is 28 k-tiles (split 4): short-K stages up to
        // 16 rows.
        for (m, c) in [(1, short8), (8, short8), (9, short16), (16, short16), (17, Config::Sm90_Stream_32x128x64), (32, Config::Sm90_Stream_32x128x64)] {
            assert_eq!(select(90, &Problem::new(m, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, wide), Some(c), "M = {m}");
            assert!(c.info().streams());
        }
        assert!(!select(90, &Problem::new(65, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, all).unwrap().info().streams());
        // Ranges of more than 32 k-tiles keep the eight-k-tile stages: 1x7168x16384 (split 2,
        // 128 k-tiles), 4x14336x4096 (split 1, 64); 8x7168x2048 is split 2, 16 k-tiles.
        assert_eq!(select(90, &Problem::new(1, 7168, 16384), OutType::F16, 132, &ANY_CLUSTERS, wide), Some(s8));
        assert_eq!(select(90, &Problem::new(4, 14336, 4096), OutType::F16, 132, &ANY_CLUSTERS, wide), Some(s8));
        assert_eq!(select(90, &Problem::new(8, 7168, 2048), OutType::F16, 132, &ANY_CLUSTERS, wide), Some(short8));
        assert_eq!(select(90, &Problem::new(16, 2048, 7168), OutType::F16, 132, &ANY_CLUSTERS, wide), Some(short16)); // split 8, 14 k-tiles
        // Either variant alone serves every K range.
        let no_short = |c: Config| wide(c) && c.info().schedule != Schedule::StreamWeightsShortK;
        assert_eq!(select(90, &Problem::new(1, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, no_short), Some(s8));
        let no_long = |c: Config| wide(c) && c != s8;
        assert_eq!(select(90, &Problem::new(1, 7168, 16384), OutType::F16, 132, &ANY_CLUSTERS, no_long), Some(short8));
        assert_eq!(split_k(short8, &Problem::new(1, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 4);
        // The 64-wide tiles where their CTAs (tiles x split) fit one wave and are at least the
        // 128-wide ones': at the same CTAs, half the split. 1x4096x7168: 64 tiles x 2 against 32
        // x 4; 1x7168x16384: 112 x 1 against 56 x 2.
        let (n8, n16) = (Config::Sm90_Stream_8x64x64, Config::Sm90_Stream_16x64x64);
        let no32 = |c: Config| !c.info().streams() || c.info().tile[1] >= 64;
        for (m, n, k, c) in [(1, 4096, 7168, n8), (8, 7168, 2048, n8), (1, 7168, 16384, n8), (9, 4096, 7168, n16), (16, 2048, 7168, n16), (17, 4096, 7168, Config::Sm90_Stream_32x128x64)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, no32), Some(c), "{m}x{n}x{k}");
        }
        assert_eq!(split_k(n8, &Problem::new(1, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 2);
        // Batches count as tiles: 1x4096x7168 x 2 is 128 tiles x 1 at 64 wide (64 x 2 at 128);
        // x 4, 256 tiles at 64 wide would take two waves.
        assert_eq!(select(90, &Problem::new(1, 4096, 7168).batch(2), OutType::F16, 132, &ANY_CLUSTERS, all), Some(n8));
        assert_eq!(select(90, &Problem::new(1, 4096, 7168).batch(4), OutType::F16, 132, &ANY_CLUSTERS, all), Some(s8));
        // Fewer CTAs at 64 wide still split into K ranges of at most 128 k-tiles: 1x3072x4096 (48
        // tiles x 2 against 24 x 5), 16x1536x7168 (24 x 5 against 12 x 11); else the 128-wide:
        // split 1 (1x5120x5120: 80 x 1 against 40 x 3; 1x5120x27648: 80 x 1, 432 k-tiles) or two
        // waves (4x14336x4096: 224 tiles against 112).
        for (m, n, k, c) in [(1, 3072, 4096, n8), (1, 3072, 7168, n8), (16, 1536, 7168, n16), (1, 5120, 5120, short8), (16, 5120, 5120, short16), (1, 5120, 27648, s8), (4, 14336, 4096, s8)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, no32), Some(c), "{m}x{n}x{k}");
        }
        // The 32-wide tiles where their K ranges are at most 56 k-tiles: 1x2048x7168 (64 tiles x 2,
        // 56 k-tiles, against 32 x 4 at 64 wide), 16x1536x7168 (48 x 2 against 24 x 5),
        // 1x576x7168 (18 x 7 against 9 x 14), 1x4096x512 (128 x 1, 8 k-tiles, against 64 x 1);
        // not with longer ranges (1x4096x7168: 128 x 1, 112 k-tiles; 1x4096x4096: 64;
        // 1x2048x16384: 64 x 2, 128; 1x1024x16384: 32 x 4, 64) or two waves (1x7168x2048).
        let (w8, w16) = (Config::Sm90_Stream_8x32x64, Config::Sm90_Stream_16x32x64);
        for (m, n, k, c, s) in [(1, 2048, 7168, w8, 2), (8, 2048, 7168, w8, 2), (16, 2048, 7168, w16, 2), (16, 1536, 7168, w16, 2), (1, 576, 7168, w8, 7), (1, 2048, 2048, w8, 2), (1, 4096, 512, w8, 1), (16, 4096, 512, w16, 1), (1, 4096, 7168, n8, 2), (16, 4096, 7168, n16, 2), (1, 4096, 4096, n8, 2), (1, 2048, 16384, n8, 4), (1, 1024, 16384, n8, 8), (1, 7168, 2048, n8, 1), (1, 3072, 4096, n8, 2)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all), Some(c), "{m}x{n}x{k}");
            assert_eq!(split_k(c, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS), s, "{m}x{n}x{k}");
        }
        // At 32 rows only with short K ranges: 32x7168x2048 (112 tiles x 1, 32 k-tiles) and
        // 32x2048x7168 (32 x 4, 28) take 32x64; 32x4096x7168 (64 x 2, 56 k-tiles) and
        // 32x7168x16384 (112 x 1, 256) keep 32x128.
        let n32 = Config::Sm90_Stream_32x64x64;
        for (m, n, k, c) in [(32, 7168, 2048, n32), (17, 2048, 7168, n32), (32, 4096, 7168, Config::Sm90_Stream_32x128x64), (32, 7168, 16384, Config::Sm90_Stream_32x128x64), (64, 7168, 2048, Config::Sm90_Stream_32x128x64)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all), Some(c), "{m}x{n}x{k}");
        }
        // 33 to 64 rows: a swapped 64-row tile (here 64x128 alone; which of the two:
        // swapped_64_rows_by_the_model below), unless the 32-row stream tile's K ranges are
        // short and its CTAs one wave: 64x4096x7168 (64 tiles x 2, 56 k-tiles), 64x7168x16384
        // (112 x 1, 256), 64x14336x4096 (224 tiles) and 64x28672x2048 (448 tiles of 32 k-tiles:
        // two waves) take it; 64x7168x2048 (112 x 1, 32 k-tiles) and 64x2048x7168 (32 x 4, 28)
        // keep the stream tile; without the swapped tiles, the stream tile.
        let (s64, w64) = (Config::Sm90_Swapped_64x128x64, Config::Sm90_Swapped_64x256x64);
        for (m, n, k, c) in [(33, 4096, 7168, s64), (64, 4096, 7168, s64), (48, 7168, 16384, s64), (64, 14336, 4096, s64), (48, 28672, 2048, s64), (64, 2048, 7168, Config::Sm90_Stream_32x128x64), (64, 7168, 2048, Config::Sm90_Stream_32x128x64)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, |c| c != w64), Some(c), "{m}x{n}x{k}");
        }
        assert_eq!(select(90, &Problem::new(64, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, |c| c != s64 && c != w64), Some(Config::Sm90_Stream_32x128x64));
        // 64x256 alone serves where 64x128 would (its estimate against none).
        assert_eq!(select(90, &Problem::new(64, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, |c| c != s64), Some(w64));
        assert_eq!(select(90, &Problem::new(64, 7168, 2048), OutType::F16, 132, &ANY_CLUSTERS, |c| c != s64), Some(Config::Sm90_Stream_32x128x64));
        // Only the 64-wide tiles built: they serve every shape.
        let narrow = |c: Config| !c.info().streams() || c.info().tile[1] == 64 || c.info().tile[0] == 32;
        assert_eq!(select(90, &Problem::new(4, 14336, 4096), OutType::F16, 132, &ANY_CLUSTERS, narrow), Some(n8));
        // Without the stream tiles the earlier rule answers.
        let no_stream = |c: Config| !c.info().streams();
        assert_eq!(select(90, &Problem::new(1, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, no_stream), Some(Config::Sm90_Swapped_128x128x64));
        // One CTA per SM: K ranges fill the SMs the tiles leave, each of at least 8 k-tiles.
        assert_eq!(split_k(s8, &Problem::new(1, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 4); // 32 tiles
        assert_eq!(split_k(s8, &Problem::new(1, 7168, 16384), OutType::F16, 132, &ANY_CLUSTERS), 2); // 56 tiles
        assert_eq!(split_k(Config::Sm90_Stream_32x128x64, &Problem::new(64, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS), 2); // 2 x 32 tiles
        assert_eq!(split_k(s8, &Problem::new(1, 512, 16384), OutType::F16, 132, &ANY_CLUSTERS), 32); // 4 tiles, at most 32 ranges
        assert_eq!(split_k(s8, &Problem::new(1, 128, 256), OutType::F16, 132, &ANY_CLUSTERS), 1); // 4 k-tiles
        assert_eq!(split_k(s8, &Problem::new(1, 4096, 7168).batch(4), OutType::F16, 132, &ANY_CLUSTERS), 1); // 128 tiles over the batches
        assert!(cluster_reduced(s8, 2) && cluster_reduced(s8, SM90_MAX_CLUSTER_SPLIT) && !cluster_reduced(s8, SM90_MAX_CLUSTER_SPLIT + 1));
        // Clusters that do not all fit at once (32 of 4 > 30): the same split, summed in global
        // memory.
        let (p, mut few) = (Problem::new(1, 4096, 7168), ANY_CLUSTERS);
        few[2] = 30;
        assert_eq!(split_k(s8, &p, OutType::F16, 132, &few), 4);
        assert!(!cluster_split(s8, &p, 4, &few) && cluster_split(s8, &p, 4, &ANY_CLUSTERS) && cluster_split(s8, &p, 3, &few));
        // The swapped rule lowers the split until its clusters fit; 128x256 and 256x128 (no
        // fitted cost of the global sum) never keep a cluster split whose clusters do not fit
        // (only a split beyond 8 ranges, where clusters of 8 do not fit, through global memory).
        let wide = Config::Sm90_128x256x64;
        let q = Problem::new(128, 7168, 16384);
        let s = split_k(wide, &q, OutType::F16, 132, &few);
        assert!(!cluster_reduced(wide, s) || cluster_split(wide, &q, s, &few));
    }

    /// 33 to 64 rows, where a swapped tile is taken: 64x256 where `swapped_estimate_us` models it
    /// faster than 64x128. Both forced at their own splits on an H100, same run, two rounds (one at
    /// 64x4096x28672), graph us, f16 (bench/DESIGN.md §12): the model picked the faster at each of
    /// these 14 shapes at the splits of 44362b8's rule. Three of them now take a split the
    /// clusters would have lowered, summed in global memory (bench/DESIGN.md §8), against the
    /// other tile at 44362b8's launch; at 64x4096x28672 64x256 at split 8 through global memory
    /// took 43.45-43.47 us, 0.6 under the pick (the model's margin there is 0.03 us).
    #[test]
    fn swapped_64_rows_by_the_model() {
        let all = |_| true;
        let (s64, w64) = (Config::Sm90_Swapped_64x128x64, Config::Sm90_Swapped_64x256x64);
        let picks = [
            (64, 4096, 7168, s64),   // 17.4 against 17.9 (64x256 at split 6)
            (64, 14336, 4096, s64),  // 23.5-23.7 against 24.5
            (64, 2048, 16384, s64),  // 19.9-20.0 against 24.2
            (64, 3072, 7168, s64),   // 14.3 against 15.4
            (64, 7168, 4096, s64),   // 15.8 against 15.9
            (64, 7168, 16384, w64),  // 45.0-45.3 against 40.8
            (64, 7168, 8192, w64),   // 25.8-26.0 against 24.2-24.3
            (64, 4096, 16384, s64),  // 28.2 (split 4 through global memory) against 30.6-30.9 (64x256, split 6)
            (64, 4096, 28672, s64),  // 44.0-44.1 (split 4 through global memory) against 47.3-47.9 (64x256, split 6)
            (64, 14336, 16384, w64), // 79.6-80.1 against 72.8-73.2
            (64, 28672, 4096, w64),  // 45.4 against 38.2 (224 tiles of 64x128: two waves)
            (64, 18432, 7168, w64),  // 72.3-72.7 against 61.2
            (64, 5120, 27648, w64),  // 70.2-70.6 (64x128 at split 2) against 53.6-53.8 (split 5); split 6 through global memory 50.5-50.9
            (48, 28672, 2048, w64),  // 26.1-26.3 against 21.8-21.9
        ];
        for (m, n, k, c) in picks {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &H100_CLUSTERS, all), Some(c), "{m}x{n}x{k}");
        }
        // Splits the clusters that fit hold down (64x256 at 64x4096x16384: 15 clusters of 7 and 8
        // for 16 tiles; 64x128 at 64x5120x27648: 39 clusters of 3 for 40 tiles) are taken whole
        // through global memory where the model says so (`swapped_split_through_global_memory`).
        assert_eq!(split_k(w64, &Problem::new(64, 4096, 16384), OutType::F16, 132, &H100_CLUSTERS), 8);
        assert_eq!(split_k(s64, &Problem::new(64, 5120, 27648), OutType::F16, 132, &H100_CLUSTERS), 3);
        assert_eq!(split_k(w64, &Problem::new(64, 5120, 27648), OutType::F16, 132, &H100_CLUSTERS), 6);
    }

    /// Where the clusters that fit would lower a swapped tile's split, or the split is beyond a
    /// cluster's 8 ranges, the split as it was with the sum through global memory, where
    /// `swapped_model_us` says so: (config, split, through global memory). H100, same runs, two
    /// rounds, graph us, f16 (then FP4 output), every output exact (bench/DESIGN.md §8): the
    /// rule's launch against the other.
    #[test]
    fn swapped_split_through_global_memory() {
        let all = |_| true;
        let (s64, w64, s128) = (Config::Sm90_Swapped_64x128x64, Config::Sm90_Swapped_64x256x64, Config::Sm90_Swapped_128x128x64);
        let launch_for = |m, n, k, out| {
            let p = Problem::new(m, n, k);
            let c = select(90, &p, out, 132, &H100_CLUSTERS, all).unwrap();
            let s = split_k(c, &p, out, 132, &H100_CLUSTERS);
            (c, s, s > 1 && !cluster_split(c, &p, s, &H100_CLUSTERS))
        };
        let launch = |m, n, k| launch_for(m, n, k, OutType::F16);
        let cases = [
            ((64, 4096, 7168), (s64, 4, true)),   // 17.06-17.17 against split 3 in clusters 17.64-17.71
            ((48, 4096, 7168), (s64, 4, true)),   // 16.86-16.95 against 17.49-17.62
            ((64, 3072, 7168), (s64, 4, false)),  // 14.36 against split 5 through global 16.53-16.57
            ((64, 2560, 7168), (s64, 5, false)),  // 13.24-13.25 against split 6, 15.62-15.65
            ((128, 3072, 7168), (s128, 4, false)), // 18.43-18.48 against split 5, 23.32-23.41
            ((128, 2560, 7168), (s128, 5, false)), // 17.10-17.12 against split 6, 22.06-22.16
            ((128, 4096, 16384), (s128, 4, true)), // 36.3-36.7 against 128x256 at split 6, 39.7-39.8
            ((128, 4096, 12288), (s128, 4, true)), // 30.0-30.1 against split 3 in clusters, 31.8-31.9
            ((192, 2048, 16384), (s128, 4, true)), // 37.4 against 256x128 at split 6, 38.3-38.4
            ((64, 10240, 7168), (w64, 3, true)),   // 31.7 against split 2 in clusters, 35.9-36.1
            ((64, 5120, 27648), (w64, 6, true)),   // 50.5-50.9 against split 5 in clusters, 53.4-53.6
            ((64, 2560, 24576), (s64, 6, true)),   // 29.0-29.1 against split 5 in clusters, 30.7-30.8
            ((64, 2048, 16384), (s64, 8, true)),   // 19.0-19.1 against split 6 in clusters, 20.1-20.2
            ((64, 2048, 24576), (s64, 8, true)),   // 24.55-24.71 against split 6 in clusters, 26.70-26.77
            ((64, 2048, 12288), (s64, 6, false)),  // 16.6 against split 8 through global, 16.7
            ((64, 1920, 16384), (s64, 8, false)),  // 17.24-17.27 against split 6 in clusters, 20.05-20.09
            ((64, 10240, 5120), (w64, 3, true)),   // 26.7-26.8 against 64x128 at split 1, 27.3-27.4
            // Beyond a cluster's 8 ranges: 21.2 against split 8 in clusters 26.5-26.6; 29.8
            // against 64x256 at split 16 through global 33.1 (split 8 in clusters 41.1); a tie,
            // 41.8 against 64x128 at split 5 through global 41.7-41.8 and split 8 41.8-41.9.
            ((64, 1024, 32768), (s64, 16, true)),
            ((64, 2048, 32768), (s64, 8, true)),
            ((64, 3072, 32768), (w64, 11, true)),
            ((48, 1920, 32768), (s64, 8, false)),  // 27.0-27.2 against 64x256 at split 16, 32.1-32.3
            ((48, 2560, 28672), (s64, 6, true)),   // 32.8-32.9 against 64x256 at split 13, 35.6-35.9
            ((64, 3072, 24576), (w64, 8, false)),  // 33.5-33.7 against split 11, 35.5-35.6
            ((96, 1536, 24576), (s128, 8, false)), // 27.8-28.1 against split 11, 29.7-29.9
            ((96, 2560, 28672), (s128, 5, false)), // 43.2-43.3 against 128x256 at split 13, 55.9-56.3
            ((96, 3072, 32768), (s128, 5, true)),  // 54.1 against 128x256 at split 11, 62.2
            ((128, 2048, 32768), (s128, 8, true)), // 40.1-40.2 against 128x256 at 16, 55.2; at 8, 53.7
            ((160, 1024, 32768), (s128, 8, true)), // 42.9-43.2 against 256x128 at split 16, 56.5-56.6
            // Without a fitted global sum, 8 ranges in clusters: 42.93-43.16 against split 11
            // through global memory 52.89-52.95; 256x128 47.41-47.66 against 55.39-55.45.
            ((96, 3072, 24576), (Config::Sm90_128x256x64, 8, false)),
            ((160, 1536, 27648), (Config::Sm90_256x128x64, 8, false)),
            // A loss of 1 %: 17.7 against split 6 in clusters 17.5-17.6.
            ((33, 2048, 14336), (s64, 8, true)),
            // Kept where the other lost: 256x128 at split 5 in clusters 44.25-44.27 against the
            // swapped 128x128 at split 3 through global memory 45.9-46.5; at K = 27648
            // 67.9-68.1 against 70.7-70.9; 64x128 at split 1 23.0-23.1 against 64x256 at split 3
            // through global memory 24.4-24.5.
            ((256, 2560, 16384), (Config::Sm90_256x128x64, 5, false)),
            ((256, 2560, 27648), (Config::Sm90_256x128x64, 5, false)),
            ((64, 10240, 4096), (s64, 1, false)),
            // The model's misses, each a gain forgone: the swapped 128x128 at split 3 through
            // global memory 44.0-44.3 against 128x256 at split 5 45.1; 64x256 at split 4 through
            // global memory 45.2-45.3 against 64x128 at split 2 in clusters 45.9.
            ((128, 5120, 16384), (Config::Sm90_128x256x64, 5, false)),
            ((64, 8192, 16384), (s64, 2, false)),
        ];
        for ((m, n, k), want) in cases {
            assert_eq!(launch(m, n, k), want, "{m}x{n}x{k}");
        }
        // FP4 output: the last CTA of a global sum also encodes the whole tile. Same run, two
        // rounds, graph us, nvfp4 (ue8m0 scales take the same rule, not timed): the rule's launch
        // against the other; the first two and the last differ from f16's launch.
        let fp4 = [
            ((64, 4096, 7168), (s64, 3, false)),  // 18.35-18.39 against split 4 through global 18.81-18.98
            ((64, 2048, 16384), (s64, 6, false)), // 20.86-20.90 against split 8, 20.86-20.88
            ((64, 4096, 16384), (s64, 4, true)),  // 30.23-30.24 against 64x256 at split 6 in clusters, 31.32-31.41
            ((64, 10240, 7168), (w64, 3, true)),  // 34.78-34.94 against split 2 in clusters, 37.65-37.78
            ((128, 4096, 12288), (s128, 4, true)), // 32.72-32.75 against split 3 in clusters, 33.15-33.61
            // Not timed with FP4 output: 64x256 at split 5 in clusters where f16 takes 64x128
            // at split 3 through global memory (f16 tied, 34.87-35.11 against 34.88-34.90).
            ((64, 5120, 16384), (w64, 5, false)),
        ];
        for ((m, n, k), want) in fp4 {
            for out in [OutType::Nvfp4, OutType::Nvfp4Ue8m0] {
                assert_eq!(launch_for(m, n, k, out), want, "{m}x{n}x{k} {out:?}");
            }
        }
        for (m, n, k) in [(64, 4096, 7168), (64, 2048, 16384), (64, 5120, 16384)] {
            assert_ne!(launch_for(m, n, k, OutType::F16), launch_for(m, n, k, OutType::Nvfp4), "{m}x{n}x{k}");
        }
    }

    #[test]
    fn prepacked_weights_take_short_stages_in_one_wave() {
        let all = |_| true;
        let (s8, short8, s16, short16) = (Config::Sm90_Stream_8x128x64, Config::Sm90_StreamShortK_8x128x64, Config::Sm90_Stream_16x128x64, Config::Sm90_StreamShortK_16x128x64);
        let pick = |m, n, k, layout| for_weights(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all).unwrap(), layout, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all);
        // 1x5120x27648: 40 tiles x 3; 1x14336x4096: 112 x 1; 16x5120x27648: 40 x 3.
        for (m, n, k, std, packed) in [(1, 5120, 27648, s8, short8), (1, 14336, 4096, s8, short8), (16, 5120, 27648, s16, short16)] {
            assert_eq!(pick(m, n, k, WeightLayout::Standard), std, "{m}x{n}x{k}");
            assert_eq!(pick(m, n, k, WeightLayout::Prepacked), packed, "{m}x{n}x{k}");
        }
        // Two waves (1x18432x7168: 144 tiles) keep the long stages; other picks are untouched.
        assert_eq!(pick(1, 18432, 7168, WeightLayout::Prepacked), s8);
        assert_eq!(pick(1, 4096, 7168, WeightLayout::Prepacked), Config::Sm90_Stream_8x64x64);
        assert_eq!(pick(128, 4096, 7168, WeightLayout::Prepacked), select(90, &Problem::new(128, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, all).unwrap());
        // The short stages not built: the long ones.
        let p = Problem::new(1, 5120, 27648);
        assert_eq!(for_weights(s8, WeightLayout::Prepacked, &p, OutType::F16, 132, &ANY_CLUSTERS, |c| c != short8), s8);
    }

    #[test]
    fn shape_table_and_general_rule() {
        let all = |_| true;
        assert_eq!(select(100, &Problem::new(128, 7168, 16384), OutType::F16, 148, &ANY_CLUSTERS, all), Some(Config::Sm100_1Sm_128x64x256));
        assert_eq!(select(100, &Problem::new(2304, 4608, 7168), OutType::F16, 148, &ANY_CLUSTERS, all), Some(Config::Sm100_2Sm_256x256x256));
        // Large square: the largest tile fills 148 SMs.
        assert_eq!(select(100, &Problem::new(8192, 8192, 8192), OutType::F16, 148, &ANY_CLUSTERS, all), Some(Config::Sm100_2Sm_256x256x256));
        // Small: nothing fills the GPU, the smallest tile occupies the most SMs.
        assert_eq!(select(100, &Problem::new(128, 1024, 1024), OutType::F16, 148, &ANY_CLUSTERS, all), Some(Config::Sm100_1Sm_128x64x256));
        // Only what is built is chosen; another architecture has none.
        let no_narrow = |c| c != Config::Sm100_1Sm_128x64x256;
        assert_ne!(select(100, &Problem::new(128, 7168, 16384), OutType::F16, 148, &ANY_CLUSTERS, no_narrow), Some(Config::Sm100_1Sm_128x64x256));
        // SM90: a swapped tile once its CTAs occupy a third of the SMs (256x128 where M pads
        // little, else 128x256); else 128x128. (The swapped 128x128 left out first: below.)
        let every = all;
        let all = |c: Config| c != Config::Sm90_Swapped_128x128x64;
        assert_eq!(select(90, &Problem::new(128, 7168, 16384), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 28 tiles x split 4, 64 k-tiles each
        assert_eq!(select(90, &Problem::new(2048, 2048, 2048), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64)); // 128 tiles
        assert_eq!(select(90, &Problem::new(256, 7168, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64)); // 56 x split 2, 56 k-tiles
        assert_eq!(select(90, &Problem::new(128, 4096, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 16 x 8 CTAs
        assert_eq!(select(90, &Problem::new(128, 3072, 1536), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 12 x 6 CTAs
        assert_eq!(select(90, &Problem::new(128, 7168, 2048), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // split 4 through the cluster
        assert_eq!(select(90, &Problem::new(128, 7168, 512), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // split 2 (8 k-tiles): 56 CTAs
        assert_eq!(select(90, &Problem::new(128, 2048, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 8 x 8 CTAs
        assert_eq!(select(90, &Problem::new(128, 2048, 4096), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 8 x 8 CTAs
        assert_eq!(select(90, &Problem::new(128, 1536, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 6 x 8 CTAs
        assert_eq!(select(90, &Problem::new(128, 1024, 4096), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x128x64)); // 4 x 8 CTAs
        assert_eq!(select(90, &Problem::new(512, 1536, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64)); // 24 x 5 CTAs
        assert_eq!(select(90, &Problem::new(1152, 2048, 4096), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64)); // 72 CTAs; 256-row tiles pad M to 1280
        assert_eq!(select(90, &Problem::new(8192, 8192, 8192), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64));
        assert_eq!(select(90, &Problem::new(2304, 4608, 7168), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64)); // 9 x 36 tiles
        // Not 256x128 where M pads: twice over at M = 128, 640 rows to 768.
        assert_eq!(select(90, &Problem::new(128, 16384, 4096), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64));
        assert_eq!(select(90, &Problem::new(640, 24576, 1024), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_128x256x64));
        assert_eq!(select(90, &Problem::new(1000, 16384, 1024), OutType::F16, 132, &ANY_CLUSTERS, all), Some(Config::Sm90_256x128x64)); // both pad to 1024
        let no_tall = |c: Config| c != Config::Sm90_256x128x64;
        assert_eq!(select(90, &Problem::new(2048, 2048, 2048), OutType::F16, 132, &ANY_CLUSTERS, no_tall), Some(Config::Sm90_128x256x64));
        let neither = |c: Config| c != Config::Sm90_128x256x64 && c != Config::Sm90_256x128x64;
        assert_eq!(select(90, &Problem::new(2048, 2048, 2048), OutType::F16, 132, &ANY_CLUSTERS, neither), Some(Config::Sm90_128x128x64));
        // The swapped 128x128 stands in for 128x256 where modelled faster (swapped_estimate_us):
        // short K ranges, where the fixed costs weigh, or more CTAs.
        let all = every;
        let narrow = Some(Config::Sm90_Swapped_128x128x64);
        for (m, n, k) in [(128, 4096, 7168), (128, 7168, 2048), (128, 3072, 1536), (128, 7168, 512), (128, 2048, 7168), (128, 1536, 7168), (128, 7168, 4096), (128, 1024, 4096), (640, 7168, 2048), (384, 1536, 4096), (128, 16384, 7168), (640, 16384, 4096), (384, 4096, 7168), (128, 3072, 16384), (128, 7168, 8192)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all), narrow, "{m}x{n}x{k}");
        }
        // ... and for 256x128 (same run, graph us, f16, 256x128 against the swapped 128x128 at
        // each one's split, bench/DESIGN.md §8): 64 tiles at split 2 where 256x128's 32 are held
        // to split 3, short K ranges, or a wave's worth more CTAs.
        for (m, n, k) in [(256, 4096, 7168), (256, 4096, 2048), (256, 4096, 16384), (160, 4096, 7168), (512, 2048, 8192), (1024, 1024, 8192), (512, 2048, 2048), (256, 7168, 2048), (512, 4096, 2048), (256, 1024, 7168), (256, 1536, 4096), (768, 2816, 4096), (768, 7168, 4096), (1024, 5120, 7168), (2048, 3072, 4096)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &H100_CLUSTERS, all), narrow, "{m}x{n}x{k}");
        }
        // The third-of-the-SMs rule sees the swapped 128x128 where it stands in: outputs whose
        // 256x128 CTAs fill too few SMs no longer fall back to the unswapped 128x128 (measured
        // faster or equal, bench/DESIGN.md §8).
        for (m, n, k) in [(160, 512, 14336), (256, 512, 7168), (256, 1024, 1024), (512, 1024, 512)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &H100_CLUSTERS, all), narrow, "{m}x{n}x{k}");
        }
        // Long K ranges at the same CTAs keep 256x128, as do the large squares.
        for (m, n, k) in [(256, 7168, 7168), (512, 4096, 7168), (256, 3072, 7168), (2048, 2048, 2048), (8192, 8192, 8192)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &H100_CLUSTERS, all), Some(Config::Sm90_256x128x64), "{m}x{n}x{k}");
        }
        // Long K ranges keep 128x256, as do outputs that fill the GPU with 128x256 tiles; a
        // swapped tile whose CTAs fill under a third of the SMs still gives way to the unswapped
        // 128x128 (128x512x2048: 4 x 8 CTAs).
        let wide = Config::Sm90_128x256x64;
        for (m, n, k, c) in [(128, 7168, 16384, wide), (384, 7168, 2304, wide), (640, 4096, 4096, wide), (1152, 2048, 4096, wide), (640, 24576, 1024, wide), (256, 7168, 7168, Config::Sm90_256x128x64), (128, 512, 2048, Config::Sm90_128x128x64)] {
            assert_eq!(select(90, &Problem::new(m, n, k), OutType::F16, 132, &ANY_CLUSTERS, all), Some(c), "{m}x{n}x{k}");
        }
        assert_eq!(select(80, &Problem::new(128, 128, 128), OutType::F16, 132, &ANY_CLUSTERS, all), None);
        assert_eq!(select(100, &Problem::new(128, 128, 128), OutType::F16, 148, &ANY_CLUSTERS, |_| false), None);
    }
}
