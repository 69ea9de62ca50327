/* SPDX-License-Identifier: Apache-2.0 */
/* kdispatch from C: a runtime over an engine's config dir, an RMSNorm on
 * host memory, and a fused-MoE config lookup.
 *
 *   cc -std=c99 example.c $(pkg-config --cflags --libs kdispatch) -o example && ./example
 * /path/to/sglang/fused_moe_triton/configs
 *
 * (an install outside the system dirs: PKG_CONFIG_PATH=<libdir>/pkgconfig; its
 * kdispatch.pc carries the rpath, so the program runs without LD_LIBRARY_PATH)
 */
#include <dispatch/c_api.h>

#include <stdio.h>
#include <string.h>

static int fail(const char* what, kdispatch_status s) {
  fprintf(stderr, "%s: %s: %s\n", what, kdispatch_status_name(s), kdispatch_last_error_message());
  return 1;
}

int main(int argc, char** argv) {
  if (kdispatch_abi_version() != KDISPATCH_ABI_VERSION) {
    fprintf(stderr, "libkdispatch %s has C ABI %d, this program was built for %d\n", kdispatch_version(),
            (int)kdispatch_abi_version(), KDISPATCH_ABI_VERSION);
    return 1;
  }
  kdispatch_options o;
  kdispatch_options_init(&o);
  const char* dirs[1] = {argc > 1 ? argv[1] : "."};
  o.config_dirs = dirs; /* the engine's own tuning tables, highest precedence */
  o.config_dirs_count = 1;
  o.backend_version = "3.5.1"; /* triton.__version__: picks triton_3_5_1/ */
  kdispatch_runtime* rt = NULL;
  kdispatch_status s = kdispatch_runtime_create(&o, &rt);
  if (s != KDISPATCH_OK) return fail("kdispatch_runtime_create", s);

  /* y = rmsnorm(x) * w on a [2, 8] fp32 host tensor, in place */
  float x[2][8], w[8];
  for (int i = 0; i < 16; ++i) x[i / 8][i % 8] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < 8; ++i) w[i] = 1.0f;
  int64_t xshape[2] = {2, 8}, wshape[1] = {8};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xshape, NULL, 0}; /* NULL strides: row-major */
  DLTensor tw = {w, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, wshape, NULL, 0};
  s = kdispatch_rmsnorm(rt, &tx, &tx, &tw, 1e-6f, /*stream=*/NULL, /*flags=*/0, /*info=*/NULL);
  if (s != KDISPATCH_OK) return fail("kdispatch_rmsnorm", s);
  printf("rmsnorm: x[0][:4] = %.4f %.4f %.4f %.4f\n", x[0][0], x[0][1], x[0][2], x[0][3]);

  /* the Triton fused-MoE config SGLang would launch at M = 64 on an H200 */
  kdispatch_lookup_query q;
  kdispatch_lookup_query_init(&q);
  q.op = "triton_fused_moe";
  q.key = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]";
  q.device = "NVIDIA H200";
  q.M = 64;
  char* json = NULL;
  s = kdispatch_lookup(rt, &q, &json);
  if (s != KDISPATCH_OK) return fail("kdispatch_lookup", s);
  printf("lookup: %.*s...\n", 160, json);
  kdispatch_free(json);

  kdispatch_runtime_destroy(rt);
  return 0;
}
