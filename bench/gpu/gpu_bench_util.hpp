// SPDX-License-Identifier: Apache-2.0
// What the CUDA benchmark tools (gpu_norm_bench.cpp, gpu_gemm_bench.cpp)
// share: a CUDA call check that exits, a device allocation, a median.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

namespace kdbench {

inline void* dalloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n));
  return p;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace kdbench
