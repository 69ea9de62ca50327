// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the static lookup key.
//
// One canonical text form serves every table kind:
//
//   <backend>/<op>|<device_name>|<fields sorted by name>[|down]
//   cpu/gemm|CPU_x86_64_AVX2|K=4096,N=4096,dtype=bf16
//   cuda/rmsnorm|NVIDIA_H200|dtype=bf16,hidden=4096
//   triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8|down
//
// The loader builds it from a file name (fields sorted, block_shape without
// spaces); an op call builds it from the Problem into a stack buffer, in the
// same sorted field order, without allocating. Both paths meet in the op's
// spec key fields (append_own_fields), so a key reported by pretune or
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

/// The sorted field list of an own-op problem, from its op's spec key
/// fields (core/op_spec.hpp), e.g. gemm K=..,N=..[,bias=true],dtype=..
/// [,out_dtype=..][,stride=..]; rmsnorm dtype=..,hidden=..[,stride=..]; the
/// fp8 GEMMs K=..,N=..[,accum=fast][,bias=true],dtype=..[,out_dtype=..][,stride=..].
void append_own_fields(const core::Problem& p, KeyBuffer* out) noexcept;

/// The full key of an own-op problem on `backend` ("cpu", "cuda", "hip").
void build_own_key(const core::Problem& p, std::string_view backend, std::string_view device_name,
                   KeyBuffer* out) noexcept;

/// The full key from parts (fields already canonical and sorted).
std::string make_key(std::string_view backend, std::string_view op, std::string_view device_name,
                     std::string_view fields, bool down);

/// XXH3-64 of the key text.
uint64_t key_hash(std::string_view key) noexcept;

/// The binary form of an own-op static key, for the op hot path: every
/// static member of the Problem (device, backend, op, dtypes, the static
/// dims n, k and extra, bias, accumulation, choice, stride classes) in a fixed 56-byte POD, so a
/// call hashes 56 bytes and compares them with one memcmp instead of
/// formatting and comparing text. Which of them an op uses is its spec's
/// business: the ones it does not use are 0 in every Problem of that op.
/// The device enters as the XXH3 of its canonical device_name; a hit also
/// compares the bucket's device_name string, so a hash collision can never
/// serve another device's table. Padding is always zero.
struct OwnKey {
  uint64_t device_hash = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t extra[3] = {0, 0, 0};
  uint64_t stride_code = 0;
  uint8_t backend = 0;
  uint8_t op = 0;
  uint8_t in_dtype = 0;
  uint8_t out_dtype = 0;
  uint8_t bias = 0;
  uint8_t accum = 0;  ///< core::Accum
  uint8_t choice = 0;
  uint8_t pad = 0;
};
static_assert(sizeof(OwnKey) == 64, "OwnKey is hashed and compared as 64 raw bytes");

/// The binary key of a problem on the device whose name hashes to
/// `device_hash` (key_hash(device_name)).
inline OwnKey make_own_key(const core::Problem& p, uint64_t device_hash) noexcept {
  OwnKey k;
  k.device_hash = device_hash;
  k.n = p.n;
  k.k = p.k;
  k.extra[0] = p.extra[0];
  k.extra[1] = p.extra[1];
  k.extra[2] = p.extra[2];
  k.stride_code = p.stride_code;
  k.backend = static_cast<uint8_t>(p.device.type);
  k.op = static_cast<uint8_t>(p.op);
  k.in_dtype = static_cast<uint8_t>(p.in_dtype);
  k.out_dtype = static_cast<uint8_t>(p.out_dtype);
  k.bias = p.has_bias ? 1 : 0;
  k.accum = static_cast<uint8_t>(p.accum);
  k.choice = p.choice;
  return k;
}

/// XXH3-64 of the 64 bytes of an OwnKey.
uint64_t own_key_hash(const OwnKey& k) noexcept;

/// Packs per-operand stride classes into Problem::stride_code (0 = every
/// operand in its default layout): classes[i][d] of operand i (the spec's
/// order, every operand: up to core::kMaxArgs) and dim d (rank 1: d 0 only;
/// rank 2 and rank 3: the rows and columns of each matrix), 4 bits per
/// operand (core::stride_class decodes them); ranks[i] 1, 2 or 3.
inline uint64_t pack_stride_code(const uint8_t (*classes)[2], const int8_t* ranks, int operands) noexcept {
  uint64_t code = 0;
  bool non_default = false;
  for (int i = 0; i < operands && i < core::kMaxArgs; ++i) {
    const int r = ranks[i];
    const int dims = r >= 2 ? 2 : 1;
    for (int d = 0; d < dims; ++d) {
      code |= static_cast<uint64_t>(classes[i][d] & 3u) << (4 * i + 2 * d);
      non_default |= classes[i][d] != static_cast<uint8_t>(core::stride_class(0, i, d, r));
    }
  }
  return non_default ? (code | core::kStrideNonDefault) : 0u;
}
static_assert(4 * core::kMaxArgs < 63, "the stride code holds 4 bits per operand below its flag bit");

}  // namespace dispatch::table
