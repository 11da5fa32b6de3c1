// The cxx bridge: looks kernels up in the table build.rs generated and forwards the launch ABI's
// structs as they are. Rust checks every argument before these are called; nothing here throws.
#include "blockscaled-gemm/cpp/host/bridge.h"

#include "blockscaled-gemm/src/sys/bridge.rs.h"
#include "blockscaled_gemm/kernel_abi.h"

// One entry function per kernel in this build: BSG_KERNEL(config index, output index, function).
#define BSG_KERNEL(config, out, fn) bsg::KernelEntry fn();
#include "kernel_table.inc"
#undef BSG_KERNEL
#define BSG_GROUPED_KERNEL(config, out, fn) bsg::GroupedEntry fn();
#include "grouped_table.inc"
#undef BSG_GROUPED_KERNEL
#define BSG_GROUPED_LIST_KERNEL(config, out, fn) bsg::GroupedListEntry fn();
#include "grouped_list_table.inc"
#undef BSG_GROUPED_LIST_KERNEL
#define BSG_W4A16_KERNEL(config, in, out, fn) bsg::KernelEntry fn();
#include "w4a16_table.inc"
#undef BSG_W4A16_KERNEL
#define BSG_W4A16_GROUPED_KERNEL(config, in, out, fn) bsg::GroupedEntry fn();
#include "w4a16_grouped_table.inc"
#undef BSG_W4A16_GROUPED_KERNEL

// CUTLASS's host reference (cpp/host/host_reference.cu).
void bsg_host_gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, const uint8_t* a, const uint8_t* sfa,
                       const uint8_t* b, const uint8_t* sfb, const float* c, float alpha, float beta,
                       float norm_constant, bool sfd_ue8m0, uint8_t* d, uint8_t* sfd);
int64_t bsg_host_sfd_cosize(int32_t m, int32_t n, int32_t l);
// The scale re-tiling kernel's launch (cpp/quant/quantize.cu).
bsg::KernelStatus bsg_tile_scales(const uint8_t* src, uint8_t* dst, int32_t rows, int32_t cols, int32_t batch, uint64_t stream);
bsg::KernelStatus bsg_prepack_values(const uint8_t* src, uint8_t* dst, int32_t rows, int32_t k, int32_t batch, bool unpack,
                                     uint64_t stream);
void bsg_host_convert(int32_t kind, const float* x, uint8_t* out, size_t len);

namespace bsg {
namespace {

// `in`: the W4A16 table's activation kind (InKind); 0 in the others.
template <class Entry>
struct Row {
  uint32_t config, in, out;
  Entry (*entry)();
};

constexpr Row<KernelEntry> kRows[] = {
#define BSG_KERNEL(config, out, fn) {config, 0, out, &fn},
#include "kernel_table.inc"
#undef BSG_KERNEL
    {~0u, ~0u, ~0u, nullptr},
};

constexpr Row<GroupedEntry> kGroupedRows[] = {
#define BSG_GROUPED_KERNEL(config, out, fn) {config, 0, out, &fn},
#include "grouped_table.inc"
#undef BSG_GROUPED_KERNEL
    {~0u, ~0u, ~0u, nullptr},
};

constexpr Row<GroupedListEntry> kGroupedListRows[] = {
#define BSG_GROUPED_LIST_KERNEL(config, out, fn) {config, 0, out, &fn},
#include "grouped_list_table.inc"
#undef BSG_GROUPED_LIST_KERNEL
    {~0u, ~0u, ~0u, nullptr},
};

constexpr Row<KernelEntry> kW4a16Rows[] = {
#define BSG_W4A16_KERNEL(config, in, out, fn) {config, in, out, &fn},
#include "w4a16_table.inc"
#undef BSG_W4A16_KERNEL
    {~0u, ~0u, ~0u, nullptr},
};

constexpr Row<GroupedEntry> kW4a16GroupedRows[] = {
#define BSG_W4A16_GROUPED_KERNEL(config, in, out, fn) {config, in, out, &fn},
#include "w4a16_grouped_table.inc"
#undef BSG_W4A16_GROUPED_KERNEL
    {~0u, ~0u, ~0u, nullptr},
};

// The entries of a table ended by a null row, made once per table: the template argument is the
// table itself, so two tables of one type and length never share a cache.
template <const auto& kTable>
const auto& entries_of() {
  using Entry = decltype(kTable[0].entry());
  constexpr size_t N = sizeof(kTable) / sizeof(kTable[0]);
  static const auto made = [] {
    struct Cache { Entry e[N]; } c{};
    for (size_t i = 0; kTable[i].entry; ++i) c.e[i] = kTable[i].entry();
    return c;
  }();
  return made.e;
}

// The entry of (config, in, out) in kTable, or null.
template <const auto& kTable>
const auto* find_in(uint32_t config, uint32_t in, uint32_t out) {
  const auto& entries = entries_of<kTable>();
  for (size_t i = 0; kTable[i].entry; ++i)
    if (kTable[i].config == config && kTable[i].in == in && kTable[i].out == out) return &entries[i];
  return static_cast<decltype(&entries[0])>(nullptr);
}

const KernelEntry* find(uint32_t config, uint32_t out) { return find_in<kRows>(config, 0, out); }
const GroupedEntry* find_grouped(uint32_t config, uint32_t out) { return find_in<kGroupedRows>(config, 0, out); }
const GroupedListEntry* find_grouped_list(uint32_t config, uint32_t out) { return find_in<kGroupedListRows>(config, 0, out); }
const KernelEntry* find_w4a16(uint32_t config, uint32_t in, uint32_t out) { return find_in<kW4a16Rows>(config, in, out); }
const GroupedEntry* find_w4a16_grouped(uint32_t config, uint32_t in, uint32_t out) { return find_in<kW4a16GroupedRows>(config, in, out); }

}  // namespace

// An entry's run and workspace query, NOT_BUILT and 0 where this build lacks it.
template <class Entry, class Args>
KernelStatus run_or_not_built(const Entry* e, const Args& args) {
  return e ? e->run(args) : KernelStatus{BSG_STATUS_NOT_BUILT, 0, 0};
}
template <class Entry, class Args>
size_t workspace_or_zero(const Entry* e, const Args& args) {
  return e ? e->workspace_size(args) : 0;
}

KernelStatus launch_grouped(uint32_t config, uint32_t out, const GroupedArgs& args) { return run_or_not_built(find_grouped(config, out), args); }

bool can_implement_grouped(uint32_t config, uint32_t out, const GroupedArgs& args) {
  const GroupedEntry* e = find_grouped(config, out);
  return e && e->can_implement(args);
}

size_t workspace_size_grouped(uint32_t config, uint32_t out, const GroupedArgs& args) { return workspace_or_zero(find_grouped(config, out), args); }

// -2: no such kernel in this build; -3: a kernel that builds no per-group arguments (SM90).
template <class Entry, class Args>
int64_t describe_in(const Entry* e, const Args& args, int32_t group, rust::Slice<int64_t> values) {
  if (!e) return -2;
  if (!e->describe) return -3;
  return e->describe(args, group, values.data(), values.size());
}

int64_t describe_grouped(uint32_t config, uint32_t out, const GroupedArgs& args, int32_t expert,
                         rust::Slice<int64_t> values) {
  return describe_in(find_grouped(config, out), args, expert, values);
}

KernelStatus launch_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args) {
  return run_or_not_built(find_grouped_list(config, out), args);
}

bool can_implement_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args) {
  const GroupedListEntry* e = find_grouped_list(config, out);
  return e && e->can_implement(args);
}

size_t workspace_size_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args) {
  return workspace_or_zero(find_grouped_list(config, out), args);
}

int64_t describe_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args, int32_t group,
                              rust::Slice<int64_t> values) {
  return describe_in(find_grouped_list(config, out), args, group, values);
}

KernelStatus launch_w4a16(uint32_t config, uint32_t in, uint32_t out, const KernelArgs& args) {
  return run_or_not_built(find_w4a16(config, in, out), args);
}

size_t workspace_size_w4a16(uint32_t config, uint32_t in, uint32_t out, const KernelArgs& args) {
  return workspace_or_zero(find_w4a16(config, in, out), args);
}

KernelStatus launch_w4a16_grouped(uint32_t config, uint32_t in, uint32_t out, const GroupedArgs& args) {
  return run_or_not_built(find_w4a16_grouped(config, in, out), args);
}

size_t workspace_size_w4a16_grouped(uint32_t config, uint32_t in, uint32_t out, const GroupedArgs& args) {
  return workspace_or_zero(find_w4a16_grouped(config, in, out), args);
}

KernelStatus launch(uint32_t config, uint32_t out, const KernelArgs& args) { return run_or_not_built(find(config, out), args); }

KernelStatus quantize(const QuantizeArgs& args) { return bsg_quantize(args); }

KernelStatus tile_scales(uint64_t src, uint64_t dst, int32_t rows, int32_t cols, int32_t batch, uint64_t stream) {
  return bsg_tile_scales(reinterpret_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst), rows, cols, batch, stream);
}

KernelStatus prepack_values(uint64_t src, uint64_t dst, int32_t rows, int32_t k, int32_t batch, bool unpack, uint64_t stream) {
  return bsg_prepack_values(reinterpret_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst), rows, k, batch, unpack, stream);
}

bool can_implement(uint32_t config, uint32_t out, const KernelArgs& args) {
  const KernelEntry* e = find(config, out);
  return e && e->can_implement(args);
}

size_t workspace_size(uint32_t config, uint32_t out, const KernelArgs& args) { return workspace_or_zero(find(config, out), args); }

int64_t sf_offsets(uint32_t config, uint32_t out, int32_t m, int32_t n, int32_t k, int32_t l, bool operand_b,
                   rust::Slice<int64_t> offsets) {
  const KernelEntry* e = find(config, out);
  if (!e) return -2;
  return e->sf_offsets(m, n, k, l, operand_b ? SfOperand::B : SfOperand::A, offsets.data(), offsets.size());
}

// Sizes were checked in Rust (src/cutlass_host.rs); an empty C slice means no C.
void host_gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, rust::Slice<const uint8_t> a,
                   rust::Slice<const uint8_t> sfa, rust::Slice<const uint8_t> b, rust::Slice<const uint8_t> sfb,
                   rust::Slice<const float> c, float alpha, float beta, float norm_constant, bool sfd_ue8m0,
                   rust::Slice<uint8_t> d, rust::Slice<uint8_t> sfd) {
  bsg_host_gemm_fp4(m, n, k, l, a.data(), sfa.data(), b.data(), sfb.data(), c.empty() ? nullptr : c.data(), alpha,
                    beta, norm_constant, sfd_ue8m0, d.data(), sfd.data());
}

int64_t host_sfd_cosize(int32_t m, int32_t n, int32_t l) { return bsg_host_sfd_cosize(m, n, l); }

void host_convert(int32_t kind, rust::Slice<const float> x, rust::Slice<uint8_t> out) {
  bsg_host_convert(kind, x.data(), out.data(), x.size() < out.size() ? x.size() : out.size());
}

rust::String cutlass_status_name(int32_t code) { return rust::String(bsg_cutlass_status_name(code)); }
rust::String cuda_error_name(int32_t code) { return rust::String(bsg_cuda_error_name(code)); }

}  // namespace bsg
