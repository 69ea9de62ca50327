// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — helpers shared by the kernel files: what the host
// can run (probed once) and the "declines with a reason" Status.
//
// The library is compiled for baseline x86-64; wider code lives in functions
// carrying GCC/Clang target attributes and is only called after this probe
// (libgcc's __builtin_cpu_supports also checks that the OS saves the wide
// register state, XCR0). Variants consult it in supports(), so a config row
// naming an ISA the host lacks is declined with a reason, never executed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "core/op.hpp"
#include "dispatch/status.hpp"

// Target attributes of the ISA-specific code. Intrinsics and wide generic
// vectors are only lowered to native instructions inside functions that carry
// one of these; callers check host_isa() first.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KDISPATCH_CPU_X86 1
#define KDISPATCH_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define KDISPATCH_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))
#define KDISPATCH_TARGET_AVX512BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#else
#define KDISPATCH_CPU_X86 0
#define KDISPATCH_TARGET_AVX2
#define KDISPATCH_TARGET_AVX512
#define KDISPATCH_TARGET_AVX512BF16
#endif

namespace dispatch::cpu {

struct HostIsa {
  bool avx2 = false;         ///< AVX2 + FMA (Haswell, Zen 1 and later)
  bool avx512 = false;       ///< AVX-512 F/BW/VL/DQ (Skylake-SP, Zen 4 and later)
  bool avx512_bf16 = false;  ///< avx512 plus AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4)
};

/// The host's ISA features. Thread-safe (a function-local static).
inline const HostIsa& host_isa() noexcept {
  static const HostIsa isa = [] {
    HostIsa h;
#if KDISPATCH_CPU_X86
    __builtin_cpu_init();
    h.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    h.avx512 = h.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    h.avx512_bf16 = h.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    return h;
  }();
  return isa;
}

/// "<variant>: <why>" (core/op.hpp).
using core::decline;

/// The calling thread's buffer of at least `n` floats for the user `Tag`
/// (one buffer per tag and thread), 64-byte aligned; it only grows: to
/// `n`, or with `geometric` to at least 1.5 times its size. nullptr when
/// the allocation fails.
template <class Tag>
float* thread_floats(std::size_t n, bool geometric) noexcept {
  struct AlignedFree {
    void operator()(float* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  thread_local std::unique_ptr<float[], AlignedFree> buf;
  thread_local std::size_t cap = 0;
  if (n > cap) {
    const std::size_t want = geometric ? std::max(n, cap + cap / 2) : n;
    auto* p = static_cast<float*>(::operator new[](want * sizeof(float), std::align_val_t{64}, std::nothrow));
    if (p == nullptr) return nullptr;
    buf.reset(p);
    cap = want;
  }
  return buf.get();
}

/// True when every param of `prm` is a value of its ParamDef's space.
inline bool params_in_space(const core::VariantDef& v, const int64_t* prm) noexcept {
  for (std::size_t i = 0; i < v.params.size(); ++i) {
    bool found = false;
    for (int64_t val : v.params[i].values) found = found || val == prm[i];
    if (!found) return false;
  }
  return true;
}

}  // namespace dispatch::cpu
