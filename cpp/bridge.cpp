// The cxx bridge: looks kernels up in the table build.rs generated and forwards plain structs.
// Every check happens in Rust before these are called; nothing here throws.
#include "blockscaled-gemm/cpp/bridge.h"

#include "blockscaled-gemm/src/ffi.rs.h"
#include "blockscaled_gemm/kernel_abi.h"

// One entry function per kernel in this build: BSG_KERNEL(config index, output index, function).
#define BSG_KERNEL(config, out, fn) bsg::KernelEntry fn();
#include "kernel_table.inc"
#undef BSG_KERNEL

// CUTLASS's host reference (cpp/host_reference.cu).
void bsg_host_gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, const uint8_t* a, const uint8_t* sfa,
                       const uint8_t* b, const uint8_t* sfb, const float* c, float alpha, float beta,
                       float norm_constant, bool sfd_ue8m0, uint8_t* d, uint8_t* sfd);
int64_t bsg_host_sfd_cosize(int32_t m, int32_t n, int32_t l);
void bsg_host_convert(int32_t kind, const float* x, uint8_t* out, size_t len);

namespace bsg {
namespace {

struct Row {
  uint32_t config, out;
  KernelEntry (*entry)();
};

constexpr Row kRows[] = {
#define BSG_KERNEL(config, out, fn) {config, out, &fn},
#include "kernel_table.inc"
#undef BSG_KERNEL
    {~0u, ~0u, nullptr},
};

const KernelEntry* find(uint32_t config, uint32_t out) {
  static const auto entries = [] {
    struct Cache { KernelEntry e[sizeof(kRows) / sizeof(Row)]; } c{};
    for (size_t i = 0; kRows[i].entry; ++i) c.e[i] = kRows[i].entry();
    return c;
  }();
  for (size_t i = 0; kRows[i].entry; ++i)
    if (kRows[i].config == config && kRows[i].out == out) return &entries.e[i];
  return nullptr;
}

KernelArgs convert(const LaunchArgs& a) {
  auto ptr = [](uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); };
  return KernelArgs{a.m, a.n, a.k, a.l, ptr(a.a), ptr(a.sfa), ptr(a.b), ptr(a.sfb), ptr(a.c), ptr(a.d),
                    a.alpha, a.beta, ptr(a.workspace), a.workspace_bytes, ptr(a.stream), a.device_id, a.sm_count,
                    a.split_k, ptr(a.sfd), reinterpret_cast<const float*>(static_cast<uintptr_t>(a.norm_constant))};
}

}  // namespace

bool kernel_built(uint32_t config, uint32_t out) { return find(config, out) != nullptr; }

bool can_implement(uint32_t config, uint32_t out, const LaunchArgs& args) {
  const KernelEntry* e = find(config, out);
  return e && e->can_implement(convert(args));
}

size_t workspace_size(uint32_t config, uint32_t out, const LaunchArgs& args) {
  const KernelEntry* e = find(config, out);
  return e ? e->workspace_size(convert(args)) : 0;
}

LaunchStatus launch(uint32_t config, uint32_t out, const LaunchArgs& args) {
  const KernelEntry* e = find(config, out);
  if (!e) return LaunchStatus{-1, 0};
  KernelStatus s = e->run(convert(args));
  return LaunchStatus{s.cutlass_status, s.cuda_error};
}

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
