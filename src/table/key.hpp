// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the static lookup key.
//
// One canonical text form serves every table kind:
//
//   <backend>/<op>|<device_name>|<fields sorted by name>[|down]
//   cpu/gemm|CPU_x86_64_AVX2|K=4096,N=4096,dtype=bf16
//   cuda/rmsnorm|NVIDIA_H200|dtype=bf16,hidden=4096
//   triton/fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8|down
//
// The loader builds it from a file name (fields sorted, block_shape without
// spaces); an op call builds it from the Problem into a stack buffer, in the
// same sorted field order, without allocating. Both paths meet in one
// function per op (append_own_fields), so a key reported by pretune or
// lookup is byte-identical to the one an op call builds. Keys are hashed
// with XXH3-64; a hit is confirmed by comparing the full key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/op.hpp"

namespace dispatch::table {

inline constexpr size_t kMaxKeyBytes = 480;

/// Fixed-capacity key text; never allocates. `overflow` is set when an
/// append did not fit (such a key never matches anything).
struct KeyBuffer {
  char data[kMaxKeyBytes];
  size_t size = 0;
  bool overflow = false;

  void append(std::string_view s) noexcept;
  void append(char c) noexcept;
  void append_int(int64_t v) noexcept;
  std::string_view view() const noexcept { return {data, size}; }
};

/// Backend folder / key prefix of engine-owned (foreign) tables.
inline constexpr std::string_view kForeignBackend = "triton";

/// Stride-class string of a problem's operands ("" for the default layout),
/// e.g. "01_o1_o1" (A broadcast along M). Chars: '0' zero, '1' unit, 'o' other.
void append_stride_field(const core::Problem& p, KeyBuffer* out) noexcept;

/// The sorted field list of an own-op problem:
///   gemm: K=..,N=..[,bias=true],dtype=..[,out_dtype=..][,stride=..]
///   rmsnorm, fused_add_rmsnorm: dtype=..,hidden=..[,stride=..]
void append_own_fields(const core::Problem& p, KeyBuffer* out) noexcept;

/// The full key of an own-op problem on `backend` ("cpu", "cuda", "hip").
void build_own_key(const core::Problem& p, std::string_view backend, std::string_view device_name,
                   KeyBuffer* out) noexcept;

/// The full key from parts (fields already canonical and sorted).
std::string make_key(std::string_view backend, std::string_view op, std::string_view device_name,
                     std::string_view fields, bool down);

/// XXH3-64 of the key text.
uint64_t key_hash(std::string_view key) noexcept;

/// Packs per-operand stride classes into Problem::stride_code (0 = default).
/// classes[i][d] for operand i (up to 4) and dim d (up to 2); ranks[i] 1 or 2.
uint32_t pack_stride_code(const uint8_t classes[4][2], const int ranks[4], int operands) noexcept;

}  // namespace dispatch::table
