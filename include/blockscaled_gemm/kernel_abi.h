// The one declaration of what crosses between Rust and the kernels: the launch arguments, the
// status, the output and operand kinds, and the limits both sides apply. Fixed-width types only
// and no CUDA or CUTLASS headers: the host C++ bridge, the nvcc translation units and bindgen
// (build.rs, which generates the Rust side from this file) all read it.
#pragma once

#include <stdint.h>

// Split-K through a thread-block cluster: at most the portable cluster size of CTAs.
#define BSG_SM90_MAX_CLUSTER_SPLIT 8
// Output tiles of an SM90 launch that reduces split-K through global memory: the workspace
// reserves one counter for each, at its start.
#define BSG_SM90_MAX_SPLIT_TILES 65536
// K ranges of one SM90 launch (grid.y).
#define BSG_SM90_MAX_SPLIT_K 65535
// Experts of one grouped (MoE) launch: the SM90 kernel keeps their row ranges in shared memory.
#define BSG_MAX_GROUPS 1024
// The largest M, N or K (T, N, K of a grouped launch) any kernel takes: they round sizes up to
// multiples of their tiles (at most 256) in 32-bit signed integers.
#define BSG_MAX_EXTENT (0x7FFFFFFF - 255)

// The quantizer's largest row count (M, or T of the MoE form; a multiple of 128) and batch: its
// row loop counts in 32-bit signed integers, striding by the grid, and L is grid.z. Its decode
// (QuantizeArgs::decoded) may cover up to 128 rows more (rows rounded up to 256).
#define BSG_QUANT_MAX_ROWS (65535 * 128)
#define BSG_QUANT_MAX_BATCH 65535

// The prepacked weight layout (WeightLayout::Prepacked): K in chunks of this many packed bytes
// (256 values), each chunk of every row of a batch stored together: byte j of chunk c of row r of
// batch l at ((l * chunks + c) * rows + r) * 128 + j, chunks = ceil(K / 256), the last chunk's
// bytes past K zero. A TMA box of 128 rows then reads one contiguous block.
#define BSG_PREPACK_CHUNK_BYTES 128

// KernelStatus::cutlass_status: cutlass::Status values (cpp/host/status.cu checks them), and one
// of ours.
#define BSG_STATUS_SUCCESS 0
#define BSG_STATUS_INVALID_PROBLEM 4
#define BSG_STATUS_WORKSPACE_NULL 6
#define BSG_STATUS_NOT_BUILT (-1)

namespace bsg {

// Output types, in the order of cpp/configs.def's BSG_OUTPUT lines.
enum class OutKind : int32_t { F16 = 0, Bf16 = 1, F32 = 2, Nvfp4 = 3, Nvfp4Ue8m0 = 4 };

// The layout of a weight operand's packed values (the `b_layout` fields): K-major rows as
// PyTorch holds them, or prepacked (BSG_PREPACK_CHUNK_BYTES). Scales stay in the 128x4 tiled
// layout either way. SM90 kernels only.
enum class WeightLayout : int32_t { Standard = 0, Prepacked = 1 };

// Which scale-factor operand a layout query is about.
enum class SfOperand : int32_t { A = 0, B = 1 };

// One launch, already validated by Rust (shapes, lengths, alignment, architecture); each
// adapter's can_implement repeats the size limits (BSG_MAX_EXTENT and its own). Device addresses
// and the stream are integers (CUdeviceptr, CUstream).
struct KernelArgs {
  int32_t m, n, k, l;
  uint64_t a;    // packed e2m1, (L, M, K/2) bytes, K-major
  uint64_t sfa;  // ue4m3 scales, 128x4 tiled layout
  uint64_t b;    // packed e2m1, (L, N, K/2) bytes, K-major
  uint64_t sfb;
  uint64_t c;    // (L, M, N) row-major, D's type (f32 for FP4 output); d itself when beta == 0
  uint64_t d;    // (L, M, N) row-major; FP4 output: packed e2m1, two per byte
  float alpha, beta;
  uint64_t workspace;
  uint64_t workspace_bytes;
  uint64_t stream;
  int32_t device_id;
  int32_t sm_count;
  int32_t split_k;  // K ranges (SM90 kernels; 1 for CUTLASS SM100)
  // SM90: 1 sends a split of 2 to BSG_SM90_MAX_CLUSTER_SPLIT ranges through global memory where
  // the config would reduce it in a cluster (Rust: when the clusters would not all fit at once).
  int32_t split_global;
  // FP4 output only: the normalization constant by value (SM90), and a device address that holds
  // it (SM100: CUTLASS's epilogue reads a pointer; Rust writes it in stream order).
  float norm_constant;
  uint64_t norm_constant_ptr;
  // FP4 output only: the generated scale factors, one per 16 outputs along N in the 128x4 tiled
  // layout over (M, N/16); their padding is zeroed by the launch (SM90: by the kernel; SM100: a
  // memset of sfd_bytes ahead of it, 0 where the layout has no padding).
  uint64_t sfd;
  uint64_t sfd_bytes;
  // B's values: a WeightLayout value. Prepacked (SM90 only): the K ranges of a split start at
  // multiples of the tile's TMA box of B (64 or 128 bytes of K) so that no box straddles a chunk,
  // so at most one range per box (Rust allows one per chunk, ceil(K / 256)).
  int32_t b_layout;
  // SM90 tiles that read decoded activations (kPreA: MainloopSwappedRegisterDecode's): A's decode as
  // the quantizer wrote it beside a and sfa (QuantizeArgs::decoded: (L, pre_a_rows, K rounded up
  // to 64) halves, pre_a_rows >= M), read instead of decoding a and sfa in a pre-pass. 0: the
  // launch decodes them. Other tiles read a and sfa either way.
  uint64_t pre_a;
  int32_t pre_a_rows;
};

// One grouped (mixture-of-experts) launch, already validated by Rust: for every expert e,
// D[rows of e] = alpha * expert_alpha[e] * A[rows of e] B[e]^T. The experts' rows of the stacked
// activations are [offsets[e], offsets[e + 1]), read on the device (int32, E + 1 of them) as
// their running maximum clamped to [0, rows]: a non-decreasing list inside [0, rows] as it is,
// anything else as disjoint (possibly empty) ranges inside it, so nothing outside D is written.
struct GroupedArgs {
  int32_t rows, n, k, experts;  // T stacked rows; E
  uint64_t a;             // packed e2m1, (T, K/2) bytes, experts' rows in order
  uint64_t sfa;           // ue4m3, 128x4 tiled over rows where each expert's rows start at a
                          // multiple of 128: expert e at sum over j < e of ceil(rows_j / 128) * 128
  uint64_t b;             // packed e2m1, (E, N, K/2)
  uint64_t sfb;           // ue4m3, E batches of the 128x4 tiled layout over (N, K/16)
  uint64_t d;             // (T, N) row-major; FP4 output: packed e2m1, two per byte
  uint64_t offsets;       // int32 [E + 1]
  uint64_t expert_alpha;  // float [E], or 0 for ones
  float alpha;
  uint64_t workspace;  // the swapped tiles: the activations decoded to FP16 (see KernelStatus)
  uint64_t workspace_bytes;
  uint64_t stream;
  int32_t device_id;
  int32_t sm_count;
  // FP4 output only (SM90): the generated scale factors over (rows, N/16) in the MoE layout of
  // `sfa` (expert e's rows from scale row sum over j < e of ceil(rows_j / 128) * 128, the padding
  // of its 128-row blocks zeroed; scale rows past the experts' blocks are not written), so the
  // next grouped GEMM reads them with the same offsets; and the normalization constant.
  uint64_t sfd;
  float norm_constant;
  int32_t b_layout;  // the weights' values: a WeightLayout value (Prepacked: each expert's batch)
  // 1 writes zeros into D's rows no expert covers, [0, row[0]) and [row[E], T) of the offsets as
  // read above (FP4 output: their packed values; they have no scale factors): SM90 in the kernel,
  // SM100 by a memset of D ahead of it. 0 leaves them as they were.
  int32_t zero_uncovered;
};

// One grouped launch in list form: G independent GEMMs, for every group g with device sizes
// problems[3g .. 3g + 2] = (m, n, k): D_g = alpha * alphas[g] * A_g B_g^T (+ beta * C_g), each
// operand at its own device address (the arrays hold G addresses each) in the dense GEMM's
// layouts at L = 1 (A (m, k/2), B (n, k/2) packed e2m1, their scales tiled over (m, k/16) and
// (n, k/16), C and D (m, n) row-major; FP4 output: D packed, its scale factors at sfd[g] tiled
// over (m, n/16)). Sizes and addresses are read on the device. A group is skipped (nothing of it
// is read or written) unless 0 <= m <= max_m, 1 <= n <= max_n with n a multiple of the output's,
// 32 <= k <= max_k with k % 32 == 0, its operand addresses non-null and 16-byte aligned, and (the swapped
// tiles, which decode A into the workspace) the sum of m over the groups before it plus its own
// at most max_rows.
struct GroupedListArgs {
  int32_t groups, max_m, max_n, max_k;
  int64_t max_rows;
  uint64_t problems;  // int32 [groups][3]
  uint64_t a, sfa, b, sfb, c, d;  // uint64 [groups] each; c: 0 for none (then beta is 0)
  uint64_t alphas;    // float [groups], or 0 for ones
  float alpha, beta;
  uint64_t workspace;  // the groups' TMA descriptors, then (swapped tiles) the decoded activations
  uint64_t workspace_bytes;
  uint64_t stream;
  int32_t device_id;
  int32_t sm_count;
  uint64_t sfd;  // FP4 output: uint64 [groups]
  float norm_constant;
  int32_t b_layout;  // every group's B values: a WeightLayout value
};

// Input element types of the quantizer.
enum class InKind : int32_t { F32 = 0, F16 = 1, Bf16 = 2 };

// What the quantizer quantizes: x itself, or the SwiGLU of its two halves, silu(gate) * up with
// gate = x[..., :K] and up = x[..., K:] of each row of a (L, M, 2K) x, rounded to x's type
// (cpp/quant/swiglu.cuh: the arithmetic, shared bit for bit with src/swiglu.rs).
enum class QuantTransform : int32_t { None = 0, SwigluHalves = 1 };

// One quantizer call (cpp/quant/), already validated by Rust; bsg_quantize repeats the size
// limits (BSG_QUANT_MAX_ROWS, BSG_QUANT_MAX_BATCH, BSG_MAX_GROUPS) and launches nothing past
// them. x (L, M, K) row-major to packed e2m1 codes (L, M, K/2) and ue4m3 scales in the 128x4
// tiled layout, padding zeroed. amax_slot 0: global_scale is used; else the 4 bytes there
// receive the amax and the global scale is derived from it on the device. offsets non-zero
// (L = 1): the stacked activations of a mixture-of-experts layer, `experts` + 1 int32 expert
// offsets on the device; the scales go to the grouped GEMM's layout (each expert's rows from a
// multiple of 128, GroupedArgs::sfa): the scale rows the experts' blocks can reach
// (floor((m + 127 min(experts, m)) / 128) * 128) are zeroed first, then the experts' rows
// written; codes of rows no expert holds are not written.
struct QuantizeArgs {
  int32_t m, k, l;
  InKind input;
  uint64_t x;
  uint64_t codes;
  uint64_t scales;
  float global_scale;
  uint64_t amax_slot;
  uint64_t offsets;
  int32_t experts;
  uint64_t stream;
  QuantTransform transform;  // SwigluHalves: x is (L, M, 2K), its rows 2K long
  // Dense layout only; 0: none. The codes times their scales as FP16, (L, decoded_rows, K rounded
  // up to 64) halves in the order the SM90 pre-pass writes them (cpp/sm90/predecode.cuh), rows
  // from M and K past the end zero; decoded_rows >= M.
  uint64_t decoded;
  int32_t decoded_rows;
};

// The outcome of a launch: cutlass::Status and cudaError_t as integers, and the workspace bytes
// the problem needs (filled whenever the status is kErrorWorkspaceNull: nothing was launched).
struct KernelStatus {
  int32_t cutlass_status;
  int32_t cuda_error;
  uint64_t workspace_needed;
};

}  // namespace bsg

#ifdef __cplusplus
#ifndef BSG_ABI_BINDGEN
#include <cstddef>
namespace bsg {

// Whether a `b_layout` field holds a WeightLayout value (the SM90 adapters check it).
constexpr bool is_weight_layout(int32_t v) { return v == int32_t(WeightLayout::Standard) || v == int32_t(WeightLayout::Prepacked); }

// Output tag of the table (cpp/configs.def): D in e2m1 with generated scale factors of type Sf
// (cutlass::float_ue4m3_t: NVFP4; cutlass::float_ue8m0_t: CUTLASS example 72b).
template <class Sf>
struct Fp4Out {};

// Entry points one instantiation exports; the bridge holds a table of these.
struct KernelEntry {
  KernelStatus (*run)(const KernelArgs&);
  size_t (*workspace_size)(const KernelArgs&);
  bool (*can_implement)(const KernelArgs&);
  // Offsets the kernel's SF layout gives for every (row, k/16, batch) of the problem,
  // row-fastest within k within batch; returns the layout's cosize (bytes of one buffer), or -1
  // when `len` does not equal rows * (k/16) * l.
  int64_t (*sf_offsets)(int32_t m, int32_t n, int32_t k, int32_t l, SfOperand which, int64_t* out, size_t len);
};

// The grouped entry one instantiation exports (cpp/configs.def's BSG_GROUPED lines).
struct GroupedEntry {
  KernelStatus (*run)(const GroupedArgs&);
  bool (*can_implement)(const GroupedArgs&);
  size_t (*workspace_size)(const GroupedArgs&);
  // Kernels that build per-expert arguments (SM100's pointer-array GEMM; null for SM90): that
  // builder run on the host for expert `e`, with the args' offsets and expert_alpha as host
  // addresses, its result flattened into `out` (cpp/sm100/gemm_grouped.cuh says how). Returns the
  // count of values, writing them only when `len` holds them all; -1 for a refused problem.
  int64_t (*describe)(const GroupedArgs& args, int32_t e, int64_t* out, size_t len);
};

// The list-form grouped entry (cpp/configs.def's BSG_GROUPED_LIST lines).
struct GroupedListEntry {
  KernelStatus (*run)(const GroupedListArgs&);
  bool (*can_implement)(const GroupedListArgs&);
  size_t (*workspace_size)(const GroupedListArgs&);
  // As GroupedEntry::describe (SM100; null for SM90), for group `g`, with the args' problems,
  // address arrays and alphas as host addresses.
  int64_t (*describe)(const GroupedListArgs& args, int32_t g, int64_t* out, size_t len);
};

}  // namespace bsg

// The quantizer's host adapter (cpp/quant/quantize.cu).
bsg::KernelStatus bsg_quantize(const bsg::QuantizeArgs& args);

// Names for status codes (cpp/host/status.cu).
const char* bsg_cutlass_status_name(int32_t code);
const char* bsg_cuda_error_name(int32_t code);
#endif
#endif
