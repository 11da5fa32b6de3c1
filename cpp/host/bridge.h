// Declarations of the functions the cxx bridge (src/sys/bridge.rs) calls. Host C++ only.
#pragma once
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "rust/cxx.h"

namespace bsg {

KernelStatus launch(uint32_t config, uint32_t out, const KernelArgs& args);
bool can_implement(uint32_t config, uint32_t out, const KernelArgs& args);
size_t workspace_size(uint32_t config, uint32_t out, const KernelArgs& args);
int64_t sf_offsets(uint32_t config, uint32_t out, int32_t m, int32_t n, int32_t k, int32_t l, bool operand_b,
                   rust::Slice<int64_t> offsets);
void host_gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, rust::Slice<const uint8_t> a,
                   rust::Slice<const uint8_t> sfa, rust::Slice<const uint8_t> b, rust::Slice<const uint8_t> sfb,
                   rust::Slice<const float> c, float alpha, float beta, float norm_constant, bool sfd_ue8m0,
                   rust::Slice<uint8_t> d, rust::Slice<uint8_t> sfd);
int64_t host_sfd_cosize(int32_t m, int32_t n, int32_t l);
void host_convert(int32_t kind, rust::Slice<const float> x, rust::Slice<uint8_t> out);
KernelStatus quantize(const QuantizeArgs& args);
KernelStatus tile_scales(uint64_t src, uint64_t dst, int32_t rows, int32_t cols, int32_t batch, uint64_t stream);
KernelStatus prepack_values(uint64_t src, uint64_t dst, int32_t rows, int32_t k, int32_t batch, bool unpack, uint64_t stream);
KernelStatus launch_grouped(uint32_t config, uint32_t out, const GroupedArgs& args);
bool can_implement_grouped(uint32_t config, uint32_t out, const GroupedArgs& args);
size_t workspace_size_grouped(uint32_t config, uint32_t out, const GroupedArgs& args);
int64_t describe_grouped(uint32_t config, uint32_t out, const GroupedArgs& args, int32_t expert,
                         rust::Slice<int64_t> values);
KernelStatus launch_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args);
bool can_implement_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args);
size_t workspace_size_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args);
int64_t describe_grouped_list(uint32_t config, uint32_t out, const GroupedListArgs& args, int32_t group,
                              rust::Slice<int64_t> values);
KernelStatus launch_w4a16(uint32_t config, uint32_t in, uint32_t out, const KernelArgs& args);
size_t workspace_size_w4a16(uint32_t config, uint32_t in, uint32_t out, const KernelArgs& args);
KernelStatus launch_w4a16_grouped(uint32_t config, uint32_t in, uint32_t out, const GroupedArgs& args);
size_t workspace_size_w4a16_grouped(uint32_t config, uint32_t in, uint32_t out, const GroupedArgs& args);
rust::String cutlass_status_name(int32_t code);
rust::String cuda_error_name(int32_t code);

}  // namespace bsg
