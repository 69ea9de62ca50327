/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI from C (C99, -Wall -Werror, linked to the shared libkdispatch):
 * every function of dispatch/c_api.h, its results and every error path,
 * asserting the exact status codes. Prints one line per failed check and
 * exits 1 when any failed.
 *
 * Needs KDISPATCH_SHARED_DIR (compile definition: the shared data folder)
 * for the SGLang configs of case C06. */
#define _POSIX_C_SOURCE 200809L

#include <dispatch/c_api.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KDISPATCH_SHARED_DIR
#error "KDISPATCH_SHARED_DIR must be defined"
#endif
#ifndef KDISPATCH_TEST_VERSION
#error "KDISPATCH_TEST_VERSION must be defined (the project version)"
#endif

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    ++g_checks;                                                                                 \
    if (!(cond)) {                                                                              \
      ++g_failures;                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: '%s'\n", __FILE__, __LINE__, #cond, \
              kdispatch_last_error_message());                                                  \
    }                                                                                           \
  } while (0)

/* The call returns `code` (and, for a failure, a non-empty message). */
#define EXPECT(code, call)                                                                                           \
  do {                                                                                                               \
    kdispatch_status s_ = (call);                                                                                    \
    ++g_checks;                                                                                                      \
    if (s_ != (code)) {                                                                                              \
      ++g_failures;                                                                                                  \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s); last error: '%s'\n", __FILE__, __LINE__, #call, \
              (int)s_, kdispatch_status_name(s_), (int)(code), kdispatch_status_name(code),                          \
              kdispatch_last_error_message());                                                                       \
    } else if ((code) != KDISPATCH_OK && kdispatch_last_error_message()[0] == '\0') {                                \
      ++g_failures;                                                                                                  \
      fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__, #call);                            \
    } else if ((code) == KDISPATCH_OK && kdispatch_last_error_message()[0] != '\0') {                                \
      ++g_failures;                                                                                                  \
      fprintf(stderr, "%s:%d: %s succeeded but left a message\n", __FILE__, __LINE__, #call);                        \
    }                                                                                                                \
  } while (0)

#define CONTAINS(haystack, needle) CHECK((haystack) != NULL && strstr((haystack), (needle)) != NULL)

/* ------------------------------------------------------------------ helpers */

static char g_tmp[256];

static void write_file(const char* dir, const char* rel, const char* text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  /* create the parent dirs */
  for (char* p = path + strlen(dir) + 1; *p; ++p) {
    if (*p == '/') {
      *p = '\0';
      mkdir(path, 0755);
      *p = '/';
    }
  }
  FILE* f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  fputs(text, f);
  fclose(f);
}

static void path_join(char* out, size_t n, const char* a, const char* b) { snprintf(out, n, "%s/%s", a, b); }

/* The value of "key": "..." in a flat JSON text (no escapes needed here). */
static void json_string_field(const char* json, const char* key, char* out, size_t n) {
  char pat[128];
  out[0] = '\0';
  snprintf(pat, sizeof pat, "\"%s\": \"", key);
  const char* p = json ? strstr(json, pat) : NULL;
  if (!p) return;
  p += strlen(pat);
  size_t i = 0;
  while (*p && *p != '"' && i + 1 < n) out[i++] = *p++;
  out[i] = '\0';
}

typedef struct {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
} tensor;

static tensor make(void* data, DLDataTypeCode code, int bits, int ndim, int64_t d0, int64_t d1) {
  tensor r;
  memset(&r, 0, sizeof r);
  r.shape[0] = d0;
  r.shape[1] = d1;
  r.strides[0] = ndim == 2 ? d1 : 1;
  r.strides[1] = 1;
  r.t.data = data;
  r.t.device.device_type = kDLCPU;
  r.t.device.device_id = 0;
  r.t.ndim = ndim;
  r.t.dtype.code = (uint8_t)code;
  r.t.dtype.bits = (uint8_t)bits;
  r.t.dtype.lanes = 1;
  r.t.shape = r.shape;
  r.t.strides = r.strides;
  r.t.byte_offset = 0;
  return r;
}
/* The DLTensor of `r`, its shape/strides pointing into `r` (a tensor is
 * passed around by value, so the pointers are set at the point of use). */
static DLTensor* dl(tensor* r) {
  r->t.shape = r->shape;
  r->t.strides = r->strides;
  return &r->t;
}
static tensor f32_2d(float* p, int64_t rows, int64_t cols) { return make(p, kDLFloat, 32, 2, rows, cols); }
static tensor f32_1d(float* p, int64_t n) { return make(p, kDLFloat, 32, 1, n, 0); }

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16); /* the values used are exact in bf16 */
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void rmsnorm_ref(const float* x, const float* w, float eps, int64_t rows, int64_t cols, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += (double)x[r * cols + c] * x[r * cols + c];
    const double inv = 1.0 / sqrt(ss / (double)cols + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * inv * w[c];
  }
}

static int close_to(double got, double want, double rel) { return fabs(got - want) <= rel * (1.0 + fabs(want)); }

static kdispatch_runtime* make_rt(kdispatch_options* o) {
  kdispatch_runtime* rt = NULL;
  EXPECT(KDISPATCH_OK, kdispatch_runtime_create(o, &rt));
  if (!rt) {
    fprintf(stderr, "cannot continue without a runtime\n");
    exit(1);
  }
  return rt;
}

static char g_cpu[128]; /* the host CPU's device_name, e.g. CPU_x86_64_AVX512 */

/* -------------------------------------------------------------------- tests */

static void test_versions_and_status(void) {
  CHECK(kdispatch_abi_version() == KDISPATCH_ABI_VERSION);
  CHECK(KDISPATCH_ABI_VERSION == 1);
  CHECK(strcmp(kdispatch_version(), KDISPATCH_TEST_VERSION) == 0);
  static const char* const names[] = {
      "ok",           "invalid_argument",   "unsupported_problem", "unsupported_device", "no_variant",
      "config_error", "backend_error",      "out_of_memory",       "not_found",          "internal",
      "io_error",     "failed_precondition"};
  for (int i = 0; i <= 11; ++i) CHECK(strcmp(kdispatch_status_name(i), names[i]) == 0);
  CHECK(strcmp(kdispatch_status_name(-1), "unknown") == 0);
  CHECK(strcmp(kdispatch_status_name(12), "unknown") == 0);
  CHECK(KDISPATCH_FAILED_PRECONDITION == 11 && KDISPATCH_NOT_FOUND == 8 && KDISPATCH_IO_ERROR == 10);
  CHECK(kdispatch_last_error_message() != NULL);
  kdispatch_free(NULL); /* a no-op */

  kdispatch_options_init_sized(NULL, sizeof(kdispatch_options)); /* no-op */
  (kdispatch_options_init)(NULL);                                /* the exported symbol too */
  kdispatch_options o;
  memset(&o, 0xff, sizeof o);
  kdispatch_options_init(&o);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.tune_routing == NULL);
  /* A caller built before tune_routing links to the exported symbol: it
   * fills that shorter struct and never writes past its end. */
  {
    struct {
      kdispatch_options o;
      unsigned char canary[16];
    } old;
    memset(&old, 0xab, sizeof old);
    (kdispatch_options_init)(&old.o);
    const size_t v1 = offsetof(kdispatch_options, tune_routing);
    CHECK(old.o.struct_size == v1);
    CHECK(old.o.tune_reps == 5 && old.o.tune_claim_shapes == 1);
    const unsigned char* bytes = (const unsigned char*)&old;
    int untouched = 1;
    for (size_t i = v1; i < sizeof old; ++i) untouched = untouched && bytes[i] == 0xab;
    CHECK(untouched);
  }
  CHECK(o.config_dirs == NULL && o.config_dirs_count == 0);
  CHECK(o.load_shipped_configs == 1 && o.tune_mode == KDISPATCH_TUNE_OFF && o.log_level == KDISPATCH_LOG_WARN);
  CHECK(o.bound_ratio == 2.0 && o.tune_reps == 5 && o.tune_time_budget_ms == 2000.0);
  CHECK(o.tune_memory_budget_bytes == ((int64_t)1 << 30) && o.tune_persist == 1 && o.tune_validate == 1);
  CHECK(o.cache_dir == NULL && o.backend_version == NULL && o.force_count == 0 && o.aliases_count == 0);

  kdispatch_lookup_query_init(NULL);
  kdispatch_lookup_query q;
  memset(&q, 0xff, sizeof q);
  kdispatch_lookup_query_init(&q);
  CHECK(q.struct_size == sizeof q && q.M == 1 && q.key == NULL && q.down == 0 && q.op == NULL);
}

static void test_create_errors(void) {
  kdispatch_options o;
  kdispatch_runtime* rt = (kdispatch_runtime*)&o; /* must be reset to NULL on failure */
  char missing[512], file[512];
  path_join(missing, sizeof missing, g_tmp, "does-not-exist");
  path_join(file, sizeof file, g_tmp, "plain-file");
  write_file(g_tmp, "plain-file", "x");

  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(NULL, NULL));
  kdispatch_options_init(&o);
  o.struct_size = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  CONTAINS(kdispatch_last_error_message(), "struct_size");

  /* tune_routing: a missing file fails creation, naming it; "skewed" serves;
   * a caller built before the field passes the shorter struct_size and its
   * (unread) tune_routing is never looked at. */
  kdispatch_options_init(&o);
  CHECK(o.tune_routing == NULL);
  o.load_shipped_configs = 0;
  o.tune_routing = missing;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  CONTAINS(kdispatch_last_error_message(), "tune.routing: ");
  CONTAINS(kdispatch_last_error_message(), "does-not-exist");
  o.tune_routing = "skewed";
  EXPECT(KDISPATCH_OK, kdispatch_runtime_create(&o, &rt));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
  o.tune_routing = missing;
  o.struct_size = (uint32_t)offsetof(kdispatch_options, tune_routing);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_create(&o, &rt));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
  rt = (kdispatch_runtime*)&o;

  const char* dirs[1] = {missing};
  kdispatch_options_init(&o);
  o.config_dirs = dirs;
  o.config_dirs_count = 1;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  CONTAINS(kdispatch_last_error_message(), "does-not-exist"); /* names the dir */
  dirs[0] = file;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  CONTAINS(kdispatch_last_error_message(), "not a directory");
  o.config_dirs = NULL; /* count 1, no array */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  const char* null_entry[1] = {NULL};
  o.config_dirs = null_entry;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  CONTAINS(kdispatch_last_error_message(), "config_dirs[0]");

  kdispatch_options_init(&o);
  o.tune_mode = 7;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  kdispatch_options_init(&o);
  o.log_level = -1;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  kdispatch_options_init(&o);
  o.backend_version = "not-a-version";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  kdispatch_options_init(&o);
  o.tune_time_budget_ms = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  kdispatch_options_init(&o);
  o.tune_reps = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));
  kdispatch_options_init(&o);
  o.aliases_count = 1; /* arrays missing */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create(&o, &rt));

  const char* force[1] = {"rmsnorm=no_such_variant"};
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.force = force;
  o.force_count = 1;
  EXPECT(KDISPATCH_NO_VARIANT, kdispatch_runtime_create(&o, &rt));
  force[0] = "not a force entry";
  EXPECT(KDISPATCH_CONFIG_ERROR, kdispatch_runtime_create(&o, &rt));
  CHECK(rt == NULL);

  /* NULL options: every default */
  EXPECT(KDISPATCH_OK, kdispatch_runtime_create(NULL, &rt));
  CHECK(rt != NULL);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(NULL));
}

static void test_runtime_functions(void) {
  char dir[512], misses[512];
  path_join(dir, sizeof dir, g_tmp, "own-configs");
  mkdir(dir, 0755);
  char rel[512];
  snprintf(rel, sizeof rel, "cpu/rmsnorm/hidden=64,device_name=%s,dtype=fp32.json", g_cpu);
  write_file(dir, rel,
             "{\"1\": {\"variant\": \"rmsnorm_fp32__ref\"},\n"
             " \"8\": {\"variant\": \"rmsnorm_fp32__vec\", \"vec\": 8, \"unroll\": 2}}\n");
  write_file(dir, "foreign.json", "{\"not\": \"a config\"}");

  const char* dirs[1] = {dir};
  const char* from[1] = {"My Accelerator"};
  const char* to[1] = {"NVIDIA_H200"};
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.config_dirs = dirs;
  o.config_dirs_count = 1;
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  o.alias_from = from;
  o.alias_to = to;
  o.aliases_count = 1;
  kdispatch_runtime* rt = make_rt(&o);

  /* load report */
  char* json = (char*)"sentinel";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_load_report(NULL, &json));
  CHECK(json == NULL);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_load_report(rt, NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_load_report(rt, &json));
  CONTAINS(json, "\"files\"");
  CONTAINS(json, "hidden=64");
  CONTAINS(json, "foreign.json");
  CONTAINS(json, "\"skipped\"");
  kdispatch_free(json);

  /* cache dir */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_cache_dir(NULL, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_cache_dir(rt, NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_cache_dir(rt, &json));
  CHECK(json != NULL);
  kdispatch_free(json);

  /* device info */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_device_info(NULL, kDLCPU, 0, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_device_info(rt, kDLCPU, 0, NULL));
  EXPECT(KDISPATCH_UNSUPPORTED_DEVICE, kdispatch_runtime_device_info(rt, kDLExtDev, 0, &json));
  EXPECT(KDISPATCH_UNSUPPORTED_DEVICE, kdispatch_runtime_device_info(rt, kDLCUDA, 4242, &json));
  EXPECT(KDISPATCH_UNSUPPORTED_DEVICE, kdispatch_runtime_device_info(rt, kDLCPU, 3, &json));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_device_info(rt, kDLCPU, 0, &json));
  CONTAINS(json, g_cpu);
  CONTAINS(json, "\"backend\": \"cpu\"");
  kdispatch_free(json);

  /* freeze / frozen / reload */
  int32_t frozen = 7;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_freeze(NULL, 1));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_frozen(NULL, &frozen));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_frozen(rt, NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_frozen(rt, &frozen));
  CHECK(frozen == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_reload(NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_reload(rt));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_freeze(rt, 1));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_frozen(rt, &frozen));
  CHECK(frozen == 1);
  EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_runtime_reload(rt));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_freeze(rt, 0));

  /* reload picks up a new file */
  kdispatch_lookup_query q;
  kdispatch_lookup_query_init(&q);
  q.op = "triton_fused_moe";
  q.key = "E=8,N=16,dtype=fp8_w8a8";
  q.device = "NVIDIA H200";
  q.M = 3;
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"default\"");
  kdispatch_free(json);
  write_file(dir, "E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
             "{\"2\": {\"BLOCK_SIZE_M\": 16, \"BLOCK_SIZE_N\": 32, \"BLOCK_SIZE_K\": 64, \"GROUP_SIZE_M\": 1},"
             " \"4\": {\"BLOCK_SIZE_M\": 32, \"BLOCK_SIZE_N\": 32, \"BLOCK_SIZE_K\": 64, \"GROUP_SIZE_M\": 1}}");
  EXPECT(KDISPATCH_OK, kdispatch_runtime_reload(rt));
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"nearest\"");
  CONTAINS(json, "\"M\": 2,"); /* M=3 is halfway between 2 and 4: the smaller key */
  CONTAINS(json, "\"BLOCK_SIZE_M\": 16");
  CONTAINS(json, "\"num_warps\": 4, \"num_stages\": 3"); /* Triton's defaults filled in */
  kdispatch_free(json);
  q.device = "My Accelerator"; /* the alias given in the options */
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"nearest\"");
  kdispatch_free(json);

  /* tune stats */
  kdispatch_tune_stats st;
  memset(&st, 0, sizeof st);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_tune_stats(rt, &st)); /* struct_size 0 */
  st.struct_size = sizeof st;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_tune_stats(NULL, &st));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_tune_stats(rt, NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.shapes_tuned == 0 && st.frozen == 0 && st.deferred == 0 && st.capture_waits == 0);
  /* A caller built against the first header (struct up to `frozen`): its
   * fields are set, the newer ones left alone. */
  memset(&st, 0x7f, sizeof st);
  st.struct_size = (uint32_t)offsetof(kdispatch_tune_stats, deferred);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.shapes_tuned == 0 && st.frozen == 0 && st.deferred == 0x7f7f7f7f7f7f7f7fLL);
  st.struct_size = 12;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_tune_stats(rt, &st));
  st.struct_size = sizeof st;

  /* wait_tuner_idle */
  int32_t idle = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_wait_tuner_idle(NULL, 1.0, &idle));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_wait_tuner_idle(rt, 1.0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_wait_tuner_idle(rt, -1.0, &idle));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_wait_tuner_idle(rt, nan(""), &idle));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_wait_tuner_idle(rt, 1.0, &idle));
  CHECK(idle == 1);
  idle = 0; /* a timeout of 0 answers "idle now?": idle without a tuner (it said "not idle") */
  EXPECT(KDISPATCH_OK, kdispatch_runtime_wait_tuner_idle(rt, 0.0, &idle));
  CHECK(idle == 1);

  /* a table hit, its source, a default plan */
  float x[5 * 64], w[64], y[5 * 64];
  for (int i = 0; i < 5 * 64; ++i) x[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
  for (int i = 0; i < 64; ++i) w[i] = 0.5f + (float)i / 64.0f;
  tensor tx = f32_2d(x, 4, 64), ty = f32_2d(y, 4, 64), tw = f32_1d(w, 64);
  kdispatch_dispatch_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 0 && info.table_m == 1 && strcmp(info.variant, "rmsnorm_fp32__ref") == 0);
  CHECK(info.source_id > 0 && info.tuned_now == 0);
  tx = f32_2d(x, 5, 64);
  ty = f32_2d(y, 5, 64);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 0 && info.table_m == 8 && strcmp(info.variant, "rmsnorm_fp32__vec") == 0);
  CHECK(info.k_source != NULL && strcmp(info.k_source, "") == 0); /* no engine row shaped it */
  { /* a caller built before k_source: its struct size is accepted, k_source left alone */
    kdispatch_dispatch_info old;
    memset(&old, 0, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdispatch_dispatch_info, k_source);
    old.k_source = "untouched";
    EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &old));
    CHECK(old.source == 0 && old.table_m == 8 && strcmp(old.k_source, "untouched") == 0);
    old.struct_size = 12;
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &old));
  }

  char* path = NULL;
  char* sdir = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_source_path(NULL, info.source_id, &path, &sdir));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_source_path(rt, info.source_id, NULL, NULL));
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_runtime_source_path(rt, 0, &path, &sdir));
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_runtime_source_path(rt, 99999, &path, NULL));
  CHECK(path == NULL);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_source_path(rt, info.source_id, &path, &sdir));
  CHECK(path != NULL && strcmp(path, rel) == 0);
  CHECK(sdir != NULL && strcmp(sdir, dir) == 0);
  kdispatch_free(path);
  kdispatch_free(sdir);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_source_path(rt, info.source_id, NULL, &sdir));
  kdispatch_free(sdir);

  /* the own-op table through lookup and lookup_table */
  kdispatch_lookup_query_init(&q);
  q.op = "rmsnorm";
  q.key = "hidden=64,dtype=fp32";
  q.M = 1;
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"exact\"");
  CONTAINS(json, "\"variant\": \"rmsnorm_fp32__ref\"");
  CONTAINS(json, "\"source_dir\": ");
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_lookup_table(rt, &q, &json));
  CONTAINS(json, "\"rows\": {\"1\": {\"variant\": \"rmsnorm_fp32__ref\"}, \"8\": {\"variant\": \"rmsnorm_fp32__vec\"");
  kdispatch_free(json);

  /* a default plan for another hidden size; export the misses */
  float x2[2 * 32], y2[2 * 32], w2[32];
  for (int i = 0; i < 64; ++i) x2[i] = 1.0f + (float)i;
  for (int i = 0; i < 32; ++i) w2[i] = 1.0f;
  tensor tx2 = f32_2d(x2, 2, 32), ty2 = f32_2d(y2, 2, 32), tw2 = f32_1d(w2, 32);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty2), dl(&tx2), dl(&tw2), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 1 && info.table_m == -1 && info.source_id == 0);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.misses >= 1);
  path_join(misses, sizeof misses, g_tmp, "misses.csv");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_export_misses(NULL, misses));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_export_misses(rt, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_export_misses(rt, ""));
  EXPECT(KDISPATCH_IO_ERROR, kdispatch_runtime_export_misses(rt, "/nonexistent-kdispatch-dir/misses.csv"));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_export_misses(rt, misses));
  struct stat sb;
  CHECK(stat(misses, &sb) == 0 && sb.st_size > 0);

  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

static void test_ops(void) {
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = make_rt(&o);
  kdispatch_dispatch_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;

  /* ---- gemm: D = A·B^T + bias, against a double reference */
  enum { M = 3, N = 5, K = 7 };
  float a[M * K], b[N * K], d[M * N], bias[N];
  for (int i = 0; i < M * K; ++i) a[i] = (float)((i * 13) % 11) / 4.0f - 1.0f;
  for (int i = 0; i < N * K; ++i) b[i] = (float)((i * 7) % 9) / 3.0f - 1.25f;
  for (int i = 0; i < N; ++i) bias[i] = (float)i * 0.5f - 1.0f;
  tensor ta = f32_2d(a, M, K), tb = f32_2d(b, N, K), td = f32_2d(d, M, N), tbias = f32_1d(bias, N);
  for (int with_bias = 0; with_bias <= 1; ++with_bias) {
    memset(d, 0, sizeof d);
    EXPECT(KDISPATCH_OK, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), with_bias ? dl(&tbias) : NULL, NULL, 0, &info));
    CHECK(info.source == 1 && info.variant[0] != '\0');
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double ref = with_bias ? bias[j] : 0.0;
        for (int k = 0; k < K; ++k) ref += (double)a[i * K + k] * b[j * K + k];
        CHECK(close_to(d[i * N + j], ref, 1e-5));
      }
  }
  /* the capture flag: accepted (no tuning in this runtime anyway) */
  EXPECT(KDISPATCH_OK, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), dl(&tbias), NULL, KDISPATCH_CALL_CAPTURING, NULL));

  /* gemm with a per-call workspace (the CPU backend has no use for it: the
     same result) */
  {
    static char wsbuf[4096];
    memset(d, 0, sizeof d);
    EXPECT(KDISPATCH_OK,
           kdispatch_gemm_ws(rt, dl(&ta), dl(&tb), dl(&td), dl(&tbias), wsbuf, (int64_t)sizeof wsbuf, NULL, 0, &info));
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double ref = bias[j];
        for (int k = 0; k < K; ++k) ref += (double)a[i * K + k] * b[j * K + k];
        CHECK(close_to(d[i * N + j], ref, 1e-5));
      }
    EXPECT(KDISPATCH_OK, kdispatch_gemm_ws(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL, 0, NULL));
    EXPECT(KDISPATCH_INVALID_ARGUMENT,
           kdispatch_gemm_ws(NULL, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL, 0, NULL));
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm_ws(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 64, NULL, 0, NULL));
    CONTAINS(kdispatch_last_error_message(), "workspace_bytes");
    EXPECT(KDISPATCH_INVALID_ARGUMENT,
           kdispatch_gemm_ws(rt, dl(&ta), dl(&tb), dl(&td), NULL, wsbuf, -1, NULL, 0, NULL));
    CONTAINS(kdispatch_last_error_message(), "workspace_bytes");
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm_ws(rt, NULL, dl(&tb), dl(&td), NULL, NULL, 0, NULL, 0, NULL));
    CONTAINS(kdispatch_last_error_message(), "a is NULL");
  }

  /* attach_stream: GPU devices only; a machine without a usable CUDA device
     says unsupported_device, one with a device allocates the workspace */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_attach_stream(NULL, kDLCUDA, 0, NULL, 1024));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_attach_stream(rt, kDLCPU, 0, NULL, 1024));
  CONTAINS(kdispatch_last_error_message(), "is not a GPU");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_attach_stream(rt, kDLCUDA, 0, NULL, -5));
  CONTAINS(kdispatch_last_error_message(), "workspace_bytes must be >= 0");
  {
    const kdispatch_status st = kdispatch_runtime_attach_stream(rt, kDLCUDA, 0, NULL, 1024);
    CHECK(st == KDISPATCH_OK || st == KDISPATCH_UNSUPPORTED_DEVICE);
    if (st == KDISPATCH_UNSUPPORTED_DEVICE) CONTAINS(kdispatch_last_error_message(), "no usable cuda device 0");
    EXPECT(KDISPATCH_UNSUPPORTED_DEVICE, kdispatch_runtime_attach_stream(rt, kDLCUDA, 63, NULL, 1024));
  }

  /* gemm errors */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(NULL, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, NULL, dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "a is NULL");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), NULL, dl(&td), NULL, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), NULL, NULL, NULL, 0, NULL));
  tensor bad = f32_2d(b, N, K - 1); /* K disagrees */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&bad), dl(&td), NULL, NULL, 0, NULL));
  bad = f32_2d(d, M, N + 1); /* N disagrees */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&bad), NULL, NULL, 0, NULL));
  bad = f32_1d(bias, N - 1); /* bias length */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), dl(&bad), NULL, 0, NULL));
  bad = f32_1d(NULL, N); /* a bias without data is an error, not "no bias" */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), dl(&bad), NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "bias: data is NULL");
  bad = f32_2d(NULL, M, K); /* null data */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  bad = f32_2d(a, M, K);
  bad.t.ndim = 5; /* rank above kMaxRank */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  bad = f32_2d(a, M, K);
  bad.shape[0] = -1; /* negative shape */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  bad = make(a, kDLInt, 32, 2, M, K); /* a dtype kdispatch does not compute */
  EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  bad = f32_2d(a, M, K);
  bad.t.dtype.lanes = 2; /* vector lanes */
  EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  bad = f32_2d(a, M, K);
  bad.t.device.device_type = kDLVulkan; /* no backend */
  EXPECT(KDISPATCH_UNSUPPORTED_DEVICE, kdispatch_gemm(rt, dl(&bad), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  memset(&info, 0, sizeof info); /* struct_size 0 */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, &info));
  info.struct_size = sizeof info;

  /* ---- rmsnorm, fp32, then in place (y aliases x) */
  enum { T = 3, H = 48 };
  float x[T * H], w[H], y[T * H], xcopy[T * H];
  double ref[T * H];
  for (int i = 0; i < T * H; ++i) x[i] = (float)((i * 29) % 17) / 5.0f - 1.7f;
  for (int i = 0; i < H; ++i) w[i] = 0.25f + (float)(i % 5) * 0.5f;
  memcpy(xcopy, x, sizeof x);
  rmsnorm_ref(x, w, 1e-5f, T, H, ref);
  tensor tx = f32_2d(x, T, H), ty = f32_2d(y, T, H), tw = f32_1d(w, H);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-5f, NULL, 0, &info));
  for (int i = 0; i < T * H; ++i) CHECK(close_to(y[i], ref[i], 1e-5));
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&tx), dl(&tx), dl(&tw), 1e-5f, NULL, 0, NULL));
  for (int i = 0; i < T * H; ++i) CHECK(close_to(x[i], ref[i], 1e-5));
  memcpy(x, xcopy, sizeof x);

  /* rmsnorm errors */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(NULL, dl(&ty), dl(&tx), dl(&tw), 1e-5f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, NULL, dl(&tx), dl(&tw), 1e-5f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), NULL, dl(&tw), 1e-5f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), NULL, 1e-5f, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "w is NULL");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 0.0f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), -1.0f, NULL, 0, NULL));
  bad = f32_1d(w, H - 1); /* w length */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&bad), 1e-5f, NULL, 0, NULL));
  bad = f32_2d(y, T - 1, H); /* tokens disagree */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&bad), dl(&tx), dl(&tw), 1e-5f, NULL, 0, NULL));
  bad = make(y, kDLFloat, 64, 2, T, H); /* fp64 */
  EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_rmsnorm(rt, dl(&bad), dl(&tx), dl(&tw), 1e-5f, NULL, 0, NULL));
  bad = f32_2d(x, T, H);
  bad.strides[1] = 2; /* hidden must have unit stride */
  bad.strides[0] = 2 * H;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&bad), dl(&tw), 1e-5f, NULL, 0, NULL));

  /* ---- rmsnorm in bf16 (values exact in bf16) */
  uint16_t xb[2 * 8], wb[8], yb[2 * 8];
  float xf[2 * 8], wf[8];
  double refb[2 * 8];
  for (int i = 0; i < 16; ++i) xf[i] = (float)(i % 4) - 1.5f, xb[i] = to_bf16(xf[i]);
  for (int i = 0; i < 8; ++i) wf[i] = 1.0f + (float)(i % 2), wb[i] = to_bf16(wf[i]);
  rmsnorm_ref(xf, wf, 1e-6f, 2, 8, refb);
  tensor txb = make(xb, kDLBfloat, 16, 2, 2, 8), tyb = make(yb, kDLBfloat, 16, 2, 2, 8),
         twb = make(wb, kDLBfloat, 16, 1, 8, 0);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&tyb), dl(&txb), dl(&twb), 1e-6f, NULL, 0, NULL));
  for (int i = 0; i < 16; ++i) CHECK(close_to(from_bf16(yb[i]), refb[i], 1e-2));
  /* mixed dtypes */
  tensor tw8 = f32_1d(w, 8);
  EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_rmsnorm(rt, dl(&tyb), dl(&txb), dl(&tw8), 1e-6f, NULL, 0, NULL));

  /* ---- fused_add_rmsnorm: residual += x; x = rmsnorm(residual) * w */
  float r[T * H], rsum[T * H];
  double refr[T * H];
  for (int i = 0; i < T * H; ++i) r[i] = (float)((i * 11) % 13) / 6.0f - 1.0f;
  for (int i = 0; i < T * H; ++i) rsum[i] = r[i] + x[i];
  rmsnorm_ref(rsum, w, 1e-6f, T, H, refr);
  tensor tr = f32_2d(r, T, H);
  EXPECT(KDISPATCH_OK, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&tr), dl(&tw), 1e-6f, NULL, 0, &info));
  for (int i = 0; i < T * H; ++i) CHECK(r[i] == rsum[i]); /* the sum, rounded to fp32 */
  for (int i = 0; i < T * H; ++i) CHECK(close_to(x[i], refr[i], 1e-5));
  EXPECT(KDISPATCH_INVALID_ARGUMENT,
         kdispatch_fused_add_rmsnorm(NULL, dl(&tx), dl(&tr), dl(&tw), 1e-6f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, NULL, dl(&tr), dl(&tw), 1e-6f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), NULL, dl(&tw), 1e-6f, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "residual is NULL");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&tr), NULL, 1e-6f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&tx), dl(&tw), 1e-6f, NULL, 0, NULL));
  bad = f32_2d(r, T, H - 1);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&bad), dl(&tw), 1e-6f, NULL, 0, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&tr), dl(&tw), 0.0f, NULL, 0, NULL));
  memset(&info, 0, sizeof info);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_fused_add_rmsnorm(rt, dl(&tx), dl(&tr), dl(&tw), 1e-6f, NULL, 0, &info));

  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

/* Issue 31, item 6: hostile DLTensors and flags get INVALID_ARGUMENT naming
 * the argument, never a crash: a NULL shape (every op), a byte_offset or a
 * stride that overflows, sizes whose extent overflows, unknown flag bits; a
 * quantisation scale inside x is refused by all three quant ops. */
static void test_hostile_tensors_and_flags(void) {
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = make_rt(&o);
  enum { M = 4, N = 8, K = 32 };
  static float a[M * K], b[N * K], d[M * N], x[M * 128], y[M * 128], w[128], sc[8];
  static uint8_t a8[M * K], b8[N * K], q[M * 128];
  for (int i = 0; i < M * K; ++i) a[i] = 0.5f, a8[i] = 0x38;
  for (int i = 0; i < N * K; ++i) b[i] = 0.25f, b8[i] = 0x38;
  for (int i = 0; i < M * 128; ++i) x[i] = (float)(i % 9) - 4.0f;
  for (int i = 0; i < 128; ++i) w[i] = 1.0f;
  for (int i = 0; i < 8; ++i) sc[i] = 1.0f;
  tensor ta = f32_2d(a, M, K), tb = f32_2d(b, N, K), td = f32_2d(d, M, N);
  tensor tx = f32_2d(x, M, 128), ty = f32_2d(y, M, 128), tw = f32_1d(w, 128);
  tensor ta8 = make(a8, (DLDataTypeCode)10, 8, 2, M, K), tb8 = make(b8, (DLDataTypeCode)10, 8, 2, N, K);
  tensor ts1 = f32_1d(sc, 1), ts2 = f32_1d(sc + 1, 1);
  EXPECT(KDISPATCH_OK, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  EXPECT(KDISPATCH_OK,
         kdispatch_gemm_fp8_tensor(rt, dl(&ta8), dl(&tb8), dl(&td), dl(&ts1), dl(&ts2), NULL, NULL, 0, NULL));

  /* shape == NULL: the typed functions ... */
  DLTensor* bad = dl(&ta);
  bad->shape = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, bad, dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), "a: DLTensor shape is NULL (ndim 2 needs ndim sizes)") == 0);
  bad = dl(&tw);
  bad->shape = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), bad, 1e-6f, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), "w: DLTensor shape is NULL (ndim 1 needs ndim sizes)") == 0);
  bad = dl(&ts2);
  bad->shape = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT,
         kdispatch_gemm_fp8_tensor(rt, dl(&ta8), dl(&tb8), dl(&td), dl(&ts1), bad, NULL, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), "scale_b: DLTensor shape is NULL (ndim 1 needs ndim sizes)") == 0);
  {
    char* json = NULL;
    bad = dl(&ta);
    bad->shape = NULL;
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_gemm(rt, bad, dl(&tb), dl(&td), NULL, &json));
    CHECK(json == NULL);
    CHECK(strcmp(kdispatch_last_error_message(), "a: DLTensor shape is NULL (ndim 2 needs ndim sizes)") == 0);
  }
  /* ... and every op of the list by name, each argument in turn */
  {
    static const struct {
      const char* name;
      int n_tensors, n_scalars;
      const char* args[12]; /* core::kMaxArgs */
    } ops[] = {
        {"gemm", 4, 0, {"a", "b", "d", "bias"}},
        {"rmsnorm", 3, 1, {"y", "x", "w"}},
        {"fused_add_rmsnorm", 3, 1, {"x", "residual", "w"}},
        {"silu_and_mul", 2, 0, {"out", "x"}},
        {"gemm_fp8_tensor", 6, 0, {"a", "b", "d", "scale_a", "scale_b", "bias"}},
        {"gemm_fp8_rowwise", 6, 0, {"a", "b", "d", "scale_a", "scale_b", "bias"}},
        {"gemm_fp8_block", 6, 0, {"a", "b", "d", "scale_a", "scale_b", "bias"}},
        {"quant_fp8_tensor", 3, 0, {"q", "x", "scale"}},
        {"quant_fp8_token", 3, 0, {"q", "x", "scale"}},
        {"quant_fp8_group", 3, 0, {"q", "x", "scale"}},
        {"fused_moe", 8, 2, {"hidden", "w1", "w2", "topk_weights", "topk_ids", "out", "w1_scale", "w2_scale"}},
        {"moe_sum", 2, 1, {"input", "out"}},
        {"moe_align", 5, 2, {"topk_ids", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "expert_map"}},
        {"moe_gemm",
         8,
         3,
         {"a", "w", "out", "topk_weights", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "w_scale"}},
        {"moe_gemm_fp8_tensor",
         9,
         3,
         {"a", "w", "out", "topk_weights", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "w_scale",
          "a_scale"}},
        {"moe_gemm_fp8_channel",
         9,
         3,
         {"a", "w", "out", "topk_weights", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "w_scale",
          "a_scale"}},
        {"fused_moe_fp8_tensor",
         10,
         2,
         {"hidden", "w1", "w2", "topk_weights", "topk_ids", "out", "w1_scale", "w2_scale", "a1_scale", "a2_scale"}},
        {"fused_moe_fp8_channel",
         10,
         2,
         {"hidden", "w1", "w2", "topk_weights", "topk_ids", "out", "w1_scale", "w2_scale", "a1_scale", "a2_scale"}}};
    const int n_ops = (int)(sizeof ops / sizeof ops[0]);
    char* list = NULL;
    EXPECT(KDISPATCH_OK, kdispatch_op_list(&list));
    int listed = 0;
    for (const char* p = list; (p = strstr(p, "\"doc\": ")) != NULL; ++p) ++listed;
    CHECK(listed == n_ops); /* an op added to the list must be added here */
    for (int i = 0; i < n_ops; ++i) {
      char needle[64];
      snprintf(needle, sizeof needle, "{\"name\": \"%s\", \"doc\"", ops[i].name);
      CONTAINS(list, needle);
    }
    kdispatch_free(list);
    const float scal[3] = {1e-6f, 0.f, 0.f}; /* eps; or routed_scaling_factor and activation; or moe_gemm's three */
    for (int i = 0; i < n_ops; ++i)
      for (int j = 0; j < ops[i].n_tensors; ++j) {
        tensor t[12]; /* core::kMaxArgs */
        const DLTensor* p[12];
        for (int k = 0; k < ops[i].n_tensors; ++k) {
          t[k] = f32_2d(x, 2, 16);
          p[k] = dl(&t[k]);
        }
        t[j].t.shape = NULL;
        EXPECT(KDISPATCH_INVALID_ARGUMENT,
               kdispatch_op_call(rt, ops[i].name, p, ops[i].n_tensors, scal, ops[i].n_scalars, NULL, 0, NULL, 0, NULL));
        char want[128];
        snprintf(want, sizeof want, "%s: DLTensor shape is NULL (ndim 2 needs ndim sizes)", ops[i].args[j]);
        if (strcmp(kdispatch_last_error_message(), want) != 0)
          fprintf(stderr, "%s, arg %d: '%s', expected '%s'\n", ops[i].name, j, kdispatch_last_error_message(), want);
        CHECK(strcmp(kdispatch_last_error_message(), want) == 0);
      }
  }

  /* byte_offset past any address space (it segfaulted), and a usable one */
  tx = f32_2d(x, M, 128);
  dl(&tx)->byte_offset = (uint64_t)1 << 62;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), &tx.t, dl(&tw), 1e-6f, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(),
               "x: DLTensor data + byte_offset overflows (byte_offset 4611686018427387904): past the end of any "
               "64-bit address space (2^57)") == 0);
  dl(&tx)->byte_offset = UINT64_MAX;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), &tx.t, dl(&tw), 1e-6f, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(),
           "x: DLTensor data + byte_offset overflows (byte_offset 18446744073709551615)");
  tx = f32_2d(x, M - 1, 128); /* rows 1..3 of x through byte_offset */
  dl(&tx)->byte_offset = 128 * sizeof(float);
  ty = f32_2d(y, M - 1, 128);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), &tx.t, dl(&tw), 1e-6f, NULL, 0, NULL));
  {
    double ref[M * 128];
    rmsnorm_ref(x, w, 1e-6f, M, 128, ref);
    CHECK(close_to(y[0], ref[128], 1e-5) && close_to(y[2 * 128 + 127], ref[3 * 128 + 127], 1e-5));
  }
  tx = f32_2d(x, M, 128);
  ty = f32_2d(y, M, 128);

  /* strides and sizes whose extent overflows: named, not "d: overlaps an input" */
  ta = f32_2d(a, M, K);
  ta.strides[0] = (int64_t)1 << 62;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(),
               "a: DLTensor size or stride overflows: shape [4, 32] with strides [4611686018427387904, 1] reaches "
               "past the 64-bit address space (2^57 bytes)") == 0);
  ta.strides[0] = -((int64_t)1 << 62);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(),
           "a: DLTensor size or stride overflows: shape [4, 32] with strides [-4611686018427387904, 1]");
  ta = f32_2d(a, M, K);
  ta.strides[0] = INT64_MAX; /* (rows - 1) * stride overflows int64 */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "a: DLTensor size or stride overflows");
  td = f32_2d(d, M, N);
  td.strides[0] = (int64_t)1 << 60; /* the output too */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0, NULL));
  td = f32_2d(d, M, N);
  {
    const int64_t m40 = (int64_t)1 << 40;
    tensor big_a = f32_2d(a, m40, (int64_t)1 << 24), big_b = f32_2d(b, N, (int64_t)1 << 24), big_d = f32_2d(d, m40, N);
    dl(&big_a)->strides = NULL; /* compact: the row stride is K */
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, &big_a.t, dl(&big_b), dl(&big_d), NULL, NULL, 0, NULL));
    CHECK(strcmp(kdispatch_last_error_message(),
                 "a: DLTensor size or stride overflows: shape [1099511627776, 16777216] with strides [16777216, 1] "
                 "reaches past the 64-bit address space (2^57 bytes)") == 0);
    big_a = f32_2d(a, m40, (int64_t)1 << 17); /* 2^59 bytes: no int64 overflow, past the address space */
    big_b = f32_2d(b, N, (int64_t)1 << 17);
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&big_a), dl(&big_b), dl(&big_d), NULL, NULL, 0, NULL));
    CONTAINS(kdispatch_last_error_message(), "a: DLTensor size or stride overflows: shape [1099511627776, 131072]");
    tensor cube = make(x, kDLFloat, 32, 2, m40, m40); /* compact strides of [2^40, 2^40, 2^40] overflow */
    cube.t.ndim = 3;
    cube.shape[2] = m40;
    dl(&cube)->strides = NULL;
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), &cube.t, dl(&tw), 1e-6f, NULL, 0, NULL));
    CONTAINS(kdispatch_last_error_message(),
             "x: DLTensor size or stride overflows: shape [1099511627776, 1099511627776, 1099511627776]");
  }

  /* unknown flag bits, on every entry point */
  const char* all_bits =
      "flags: unknown bits 0xfffffffc (0xffffffff given; known: KDISPATCH_CALL_CAPTURING 0x1, "
      "KDISPATCH_CALL_FAST_ACCUM 0x2)";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 0xFFFFFFFFu, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), all_bits) == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0xFFFFFFFFu, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), all_bits) == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT,
         kdispatch_gemm_fp8_tensor(rt, dl(&ta8), dl(&tb8), dl(&td), dl(&ts1), dl(&ts2), NULL, NULL, 0xFFFFFFFFu, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), all_bits) == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_gemm(rt, dl(&ta), dl(&tb), dl(&td), NULL, NULL, 4u, NULL));
  CHECK(
      strcmp(
          kdispatch_last_error_message(),
          "flags: unknown bits 0x4 (0x4 given; known: KDISPATCH_CALL_CAPTURING 0x1, KDISPATCH_CALL_FAST_ACCUM 0x2)") ==
      0);
  {
    const DLTensor* t[4] = {dl(&ta), dl(&tb), dl(&td), NULL};
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_call(rt, "gemm", t, 4, NULL, 0, NULL, 0, NULL, 0x80000000u, NULL));
    CONTAINS(kdispatch_last_error_message(), "flags: unknown bits 0x80000000");
  }
  EXPECT(KDISPATCH_OK, kdispatch_gemm_fp8_tensor(rt, dl(&ta8), dl(&tb8), dl(&td), dl(&ts1), dl(&ts2), NULL, NULL,
                                                 KDISPATCH_CALL_CAPTURING | KDISPATCH_CALL_FAST_ACCUM, NULL));

  /* a quantisation scale inside x: refused by _tensor and _token as by _group */
  {
    tensor tq = make(q, (DLDataTypeCode)10, 8, 2, M, 128), tqx = f32_2d(x, M, 128);
    tensor s_tensor = f32_1d(x + 5, 1), s_token = f32_1d(x + 5, M);
    tensor s_group = f32_2d(x + 5, 1, M);
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_quant_fp8_tensor(rt, dl(&tq), dl(&tqx), dl(&s_tensor), NULL, 0, NULL));
    CHECK(strcmp(kdispatch_last_error_message(), "scale: overlaps an input (x)") == 0);
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_quant_fp8_token(rt, dl(&tq), dl(&tqx), dl(&s_token), NULL, 0, NULL));
    CHECK(strcmp(kdispatch_last_error_message(), "scale: overlaps an input (x)") == 0);
    EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_quant_fp8_group(rt, dl(&tq), dl(&tqx), dl(&s_group), NULL, 0, NULL));
    CHECK(strncmp(kdispatch_last_error_message(), "scale: overlaps an input", 24) == 0);
    /* the scale beside x, not in it: fine */
    float own[M];
    s_tensor = f32_1d(own, 1);
    s_token = f32_1d(own, M);
    EXPECT(KDISPATCH_OK, kdispatch_quant_fp8_tensor(rt, dl(&tq), dl(&tqx), dl(&s_tensor), NULL, 0, NULL));
    EXPECT(KDISPATCH_OK, kdispatch_quant_fp8_token(rt, dl(&tq), dl(&tqx), dl(&s_token), NULL, 0, NULL));
    /* M = 0: _tensor still writes its scale, an empty x's (amax 0: 1e-10 / 448); x and q without data */
    tensor eq = make(NULL, (DLDataTypeCode)10, 8, 2, 0, 128), ex = f32_2d(NULL, 0, 128);
    own[0] = 99.f;
    EXPECT(KDISPATCH_OK, kdispatch_quant_fp8_tensor(rt, dl(&eq), dl(&ex), dl(&s_tensor), NULL, 0, NULL));
    CHECK(own[0] == 1e-10f / 448.f);
  }
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

/* The fp8 GEMMs' fast_accum switch: KDISPATCH_CALL_FAST_ACCUM on the per-op
 * function (its signature unchanged), the scalar of kdispatch_op_call (0, 1,
 * or left out), and its key field: a file named accum=fast serves the fast
 * calls only. Every CPU variant accumulates in fp32: both give 32. */
static void test_fp8_fast_accum(void) {
  char dir[512], rel[512];
  path_join(dir, sizeof dir, g_tmp, "fast-accum");
  snprintf(rel, sizeof rel,
           "fast-accum/cpu/gemm_fp8_tensor/N=4,K=32,device_name=%s,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32.json",
           g_cpu);
  write_file(g_tmp, rel, "{\"2\": {\"variant\": \"gemm_fp8_tensor_e4m3fn__ref\"}}\n");
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  o.tune_mode = KDISPATCH_TUNE_OFF;
  const char* dirs[] = {dir};
  o.config_dirs = dirs;
  o.config_dirs_count = 1;
  kdispatch_runtime* rt = make_rt(&o);
  uint8_t a[2 * 32], b[4 * 32];
  memset(a, 0x38, sizeof a); /* e4m3fn 1.0 */
  memset(b, 0x38, sizeof b);
  float sa = 1.f, sb = 1.f, d[2 * 4];
  tensor ta = make(a, (DLDataTypeCode)10, 8, 2, 2, 32), tb = make(b, (DLDataTypeCode)10, 8, 2, 4, 32);
  tensor td = f32_2d(d, 2, 4), tsa = f32_1d(&sa, 1), tsb = f32_1d(&sb, 1);
  kdispatch_dispatch_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  /* precise (flags 0): the file does not serve it */
  memset(d, 0, sizeof d);
  EXPECT(KDISPATCH_OK,
         kdispatch_gemm_fp8_tensor(rt, dl(&ta), dl(&tb), dl(&td), dl(&tsa), dl(&tsb), NULL, NULL, 0, &info));
  CHECK(info.source == 1);
  CHECK(strcmp(info.variant, "gemm_fp8_tensor_e4m3fn__tiled") == 0);
  for (int i = 0; i < 8; ++i) CHECK(d[i] == 32.f);
  /* fast: the file's row at M = 2 */
  memset(d, 0, sizeof d);
  EXPECT(KDISPATCH_OK, kdispatch_gemm_fp8_tensor(rt, dl(&ta), dl(&tb), dl(&td), dl(&tsa), dl(&tsb), NULL, NULL,
                                                 KDISPATCH_CALL_FAST_ACCUM, &info));
  CHECK(info.source == 0);
  CHECK(info.table_m == 2);
  CHECK(strcmp(info.variant, "gemm_fp8_tensor_e4m3fn__ref") == 0);
  for (int i = 0; i < 8; ++i) CHECK(d[i] == 32.f);
  /* kdispatch_op_call: the switch as its one scalar, or left out (off) */
  const DLTensor* t[6] = {dl(&ta), dl(&tb), dl(&td), dl(&tsa), dl(&tsb), NULL};
  const float on = 1.f, off = 0.f, half = 0.5f, two[2] = {1.f, 1.f};
  EXPECT(KDISPATCH_OK, kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, &on, 1, NULL, 0, NULL, 0, &info));
  CHECK(info.source == 0);
  EXPECT(KDISPATCH_OK, kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, &off, 1, NULL, 0, NULL, 0, &info));
  CHECK(info.source == 1);
  EXPECT(KDISPATCH_OK, kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, NULL, 0, NULL, 0, NULL, 0, &info));
  CHECK(info.source == 1);
  EXPECT(KDISPATCH_OK,
         kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, NULL, 0, NULL, 0, NULL, KDISPATCH_CALL_FAST_ACCUM, &info));
  CHECK(info.source == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, &half, 1, NULL, 0, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(),
               "fast_accum: must be 0 or 1 (false or true: 1 asks for fast accumulation), got 0.5") == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_call(rt, "gemm_fp8_tensor", t, 6, two, 2, NULL, 0, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(), "gemm_fp8_tensor takes 0 to 1 scalars, got 2") == 0);
  /* the flag on an op without the switch */
  float x[4] = {1.f, 2.f, 3.f, 4.f}, y[4], w[4] = {1.f, 1.f, 1.f, 1.f};
  tensor tx = f32_2d(x, 1, 4), ty = f32_2d(y, 1, 4), tw = f32_1d(w, 4);
  EXPECT(KDISPATCH_INVALID_ARGUMENT,
         kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, KDISPATCH_CALL_FAST_ACCUM, NULL));
  CHECK(strcmp(kdispatch_last_error_message(),
               "flags: KDISPATCH_CALL_FAST_ACCUM is for ops with a fast_accum switch (the fp8 GEMMs), rmsnorm has "
               "none") == 0);
  /* the op list names the switch */
  char* json = NULL;
  EXPECT(KDISPATCH_OK, kdispatch_op_list(&json));
  CONTAINS(json, "\"scalars\": [{\"name\": \"fast_accum\", \"default\": 0, \"kind\": \"bool\"}]");
  CONTAINS(json, "\"scalars\": [{\"name\": \"eps\", \"default\": 9.999999974752427e-07, \"kind\": \"float\"}]");
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

static kdispatch_options tune_options(const char* cache, int mode) {
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  o.tune_mode = mode;
  o.cache_dir = cache;
  o.tune_time_budget_ms = 50;
  o.tune_reps = 1;
  o.tune_cold_cache = 0;
  return o;
}

static void test_tuning(void) {
  char cache[512];
  path_join(cache, sizeof cache, g_tmp, "cache-sync");
  mkdir(cache, 0755);
  kdispatch_options o = tune_options(cache, KDISPATCH_TUNE_SYNC);
  kdispatch_runtime* rt = make_rt(&o);
  kdispatch_dispatch_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  kdispatch_tune_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;

  float x[2 * 128], y[2 * 128], w[128];
  for (int i = 0; i < 256; ++i) x[i] = (float)(i % 9) - 4.0f;
  for (int i = 0; i < 128; ++i) w[i] = 1.0f;
  tensor tx = f32_2d(x, 2, 128), ty = f32_2d(y, 2, 128), tw = f32_1d(w, 128);
  /* during a graph capture a miss is never tuned */
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, KDISPATCH_CALL_CAPTURING, &info));
  CHECK(info.source == 1 && info.tuned_now == 0);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.shapes_tuned == 0);
  /* outside a capture, sync tuning searches on the first call */
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &info));
  CHECK(info.tuned_now == 1);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.shapes_tuned == 1 && st.candidates_run > 0);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 0 && info.tuned_now == 0);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));

  /* pretune, on descriptors without data */
  path_join(cache, sizeof cache, g_tmp, "cache-pretune");
  mkdir(cache, 0755);
  o = tune_options(cache, KDISPATCH_TUNE_OFF);
  rt = make_rt(&o);
  char* json = (char*)"sentinel";
  tensor py = f32_2d(NULL, 4, 96), px = f32_2d(NULL, 4, 96), pw = f32_1d(NULL, 96);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_rmsnorm(NULL, dl(&py), dl(&px), dl(&pw), 1e-6f, &json));
  CHECK(json == NULL);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_rmsnorm(rt, dl(&py), dl(&px), dl(&pw), 1e-6f, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_rmsnorm(rt, NULL, dl(&px), dl(&pw), 1e-6f, &json));
  tensor pbad = f32_1d(NULL, 95);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_rmsnorm(rt, dl(&py), dl(&px), dl(&pbad), 1e-6f, &json));
  EXPECT(KDISPATCH_OK, kdispatch_pretune_rmsnorm(rt, dl(&py), dl(&px), dl(&pw), 1e-6f, &json));
  CONTAINS(json, "\"key\": \"cpu/rmsnorm|");
  CONTAINS(json, "hidden=96");
  CONTAINS(json, "\"M\": 4");
  CONTAINS(json, "\"variant\": \"rmsnorm_fp32__");
  CONTAINS(json, "\"persisted\": true");
  kdispatch_free(json);
  /* the next call with those shapes is a table hit */
  float x4[4 * 96], y4[4 * 96], w4[96];
  for (int i = 0; i < 4 * 96; ++i) x4[i] = 1.0f + (float)(i % 3);
  for (int i = 0; i < 96; ++i) w4[i] = 1.0f;
  tensor tx4 = f32_2d(x4, 4, 96), ty4 = f32_2d(y4, 4, 96), tw4 = f32_1d(w4, 96);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty4), dl(&tx4), dl(&tw4), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 0 && info.table_m == 4);

  EXPECT(KDISPATCH_OK, kdispatch_pretune_fused_add_rmsnorm(rt, dl(&px), dl(&py), dl(&pw), 1e-6f, &json));
  CONTAINS(json, "\"key\": \"cpu/fused_add_rmsnorm|");
  kdispatch_free(json);
  EXPECT(KDISPATCH_INVALID_ARGUMENT,
         kdispatch_pretune_fused_add_rmsnorm(NULL, dl(&px), dl(&py), dl(&pw), 1e-6f, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_fused_add_rmsnorm(rt, dl(&px), dl(&py), dl(&pw), 1e-6f, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_fused_add_rmsnorm(rt, dl(&px), NULL, dl(&pw), 1e-6f, &json));

  tensor ga = f32_2d(NULL, 8, 64), gb = f32_2d(NULL, 32, 64), gd = f32_2d(NULL, 8, 32), gbias = f32_1d(NULL, 32);
  EXPECT(KDISPATCH_OK, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&gd), dl(&gbias), &json));
  CONTAINS(json, "\"key\": \"cpu/gemm|");
  CONTAINS(json, "bias=true");
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&gd), NULL, &json));
  CHECK(json != NULL && strstr(json, "bias=true") == NULL);
  kdispatch_free(json);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_gemm(NULL, dl(&ga), dl(&gb), dl(&gd), NULL, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&gd), NULL, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_gemm(rt, dl(&ga), NULL, dl(&gd), NULL, &json));
  tensor gbad = f32_2d(NULL, 8, 33);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&gbad), NULL, &json));
  tensor gint = make(NULL, kDLInt, 8, 2, 8, 64);
  EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_pretune_gemm(rt, dl(&gint), dl(&gb), dl(&gd), NULL, &json));
  /* fp32 inputs, an fp8_e5m2 output (DLPack code 12): refused as kdispatch_gemm refuses it, before any
   * scratch or row (it used to write fp32 into a 1-byte-per-element scratch and persist a __ref row) */
  {
    float a32[8 * 64], b32[32 * 64];
    uint8_t d8[8 * 32];
    memset(a32, 0, sizeof a32);
    memset(b32, 0, sizeof b32);
    tensor ge5 = make(NULL, (DLDataTypeCode)12, 8, 2, 8, 32);
    tensor ca = f32_2d(a32, 8, 64), cb = f32_2d(b32, 32, 64), cd = make(d8, (DLDataTypeCode)12, 8, 2, 8, 32);
    char want[256];
    EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_gemm(rt, dl(&ca), dl(&cb), dl(&cd), NULL, NULL, 0, NULL));
    snprintf(want, sizeof want, "%s", kdispatch_last_error_message());
    CHECK(strcmp(want, "no cpu variant computes gemm with fp32 inputs and fp8_e5m2 output") == 0);
    json = (char*)"sentinel";
    EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&ge5), NULL, &json));
    CHECK(strcmp(kdispatch_last_error_message(), want) == 0);
    CHECK(json == NULL);
    EXPECT(KDISPATCH_UNSUPPORTED_PROBLEM, kdispatch_pretune_gemm(rt, dl(&ca), dl(&cb), dl(&cd), NULL, &json));
    CHECK(strcmp(kdispatch_last_error_message(), want) == 0);
  }

  /* frozen: no tuning */
  EXPECT(KDISPATCH_OK, kdispatch_runtime_freeze(rt, 1));
  EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_pretune_gemm(rt, dl(&ga), dl(&gb), dl(&gd), NULL, &json));
  EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_pretune_rmsnorm(rt, dl(&py), dl(&px), dl(&pw), 1e-6f, &json));
  EXPECT(KDISPATCH_FAILED_PRECONDITION,
         kdispatch_pretune_fused_add_rmsnorm(rt, dl(&px), dl(&py), dl(&pw), 1e-6f, &json));
  CHECK(json == NULL);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_tune_stats(rt, &st));
  CHECK(st.frozen == 1);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

static void test_lookup(void) {
  const char* dirs[1] = {KDISPATCH_SHARED_DIR "/data/sglang-configs/fused_moe_triton"};
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.config_dirs = dirs;
  o.config_dirs_count = 1;
  o.backend_version = "3.5.1";
  o.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = make_rt(&o);

  /* case C06 */
  static const char* const c06 =
      "\"config\": {\"BLOCK_SIZE_M\": 16, \"BLOCK_SIZE_N\": 64, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 1, "
      "\"num_warps\": 4, \"num_stages\": 5}";
  kdispatch_lookup_query q;
  kdispatch_lookup_query_init(&q);
  q.key = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]";
  q.device = "NVIDIA H200";
  q.M = 1;
  char* json = (char*)"sentinel";
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, c06);
  CONTAINS(json, "\"match\": \"exact\"");
  CONTAINS(json, "\"M\": 1,");
  CONTAINS(
      json,
      "\"source\": \"triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json\"");
  CONTAINS(json, "\"source_dir\": \"" KDISPATCH_SHARED_DIR);
  CONTAINS(json, "\"why\": ");
  kdispatch_free(json);
  q.device = "NVIDIA H200 NVL"; /* the same part under its other name */
  q.op = "fused_moe";
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, c06);
  kdispatch_free(json);

  /* the whole table */
  EXPECT(KDISPATCH_OK, kdispatch_lookup_table(rt, &q, &json));
  CONTAINS(json, "\"key\": \"triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8\"");
  CONTAINS(json,
           "\"rows\": {\"1\": {\"BLOCK_SIZE_M\": 16, \"BLOCK_SIZE_N\": 64, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 1, "
           "\"num_warps\": 4, \"num_stages\": 5}, \"2\": ");
  CONTAINS(json, "\"sources\": {\"1\": \"triton_3_5_1/");
  CONTAINS(json, "\"source_dirs\": {\"1\": \"" KDISPATCH_SHARED_DIR);
  kdispatch_free(json);

  /* a key with no table: lookup answers SGLang's default, lookup_table NOT_FOUND */
  q.key = "E=3,N=3,dtype=fp8_w8a8";
  q.M = 2;
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"default\"");
  CONTAINS(json, "\"M\": null");
  CONTAINS(json, "\"BLOCK_SIZE_M\": 64, \"BLOCK_SIZE_N\": 128, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 1");
  kdispatch_free(json);
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_lookup_table(rt, &q, &json));
  CHECK(json == NULL);

  /* errors */
  kdispatch_lookup_query_init(&q);
  q.key = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]";
  q.device = "NVIDIA H200";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(NULL, &q, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, NULL, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &q, NULL));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(NULL, &q, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(rt, NULL, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(rt, &q, NULL));
  kdispatch_lookup_query bad = q;
  bad.struct_size = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(rt, &bad, &json));
  bad = q;
  bad.key = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  CONTAINS(kdispatch_last_error_message(), "key is NULL");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(rt, &bad, &json));
  bad = q;
  bad.M = 0;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  bad = q;
  bad.key = "garbage";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup_table(rt, &bad, &json));
  bad = q;
  bad.op = "no_such_op";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  bad = q;
  bad.op = "triton_gemm";
  bad.key = "N=7,K=7";
  bad.down = 1; /* _down tables are fused_moe's */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  bad.down = 0;
  bad.key = "N=7,K=7,dtype=fp8_w8a8"; /* no table, no default rule without block_shape */
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_lookup(rt, &bad, &json));
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_lookup_table(rt, &bad, &json));
  bad = q;
  bad.op = "rmsnorm";
  bad.key = "hidden=64,dtype=fp32";
  bad.backend = "tpu";
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_lookup(rt, &bad, &json));
  CHECK(json == NULL);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));

  /* bounded nearest: M = 1 lies outside the table's range; the table is still found */
  char dir[512];
  path_join(dir, sizeof dir, g_tmp, "bounded");
  mkdir(dir, 0755);
  write_file(dir, "E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
             "{\"256\": {\"BLOCK_SIZE_M\": 64, \"BLOCK_SIZE_N\": 64, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 8},"
             " \"512\": {\"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 64, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 8}}");
  dirs[0] = dir;
  kdispatch_options_init(&o);
  o.config_dirs = dirs;
  o.config_dirs_count = 1;
  o.load_shipped_configs = 0;
  o.bounded_nearest = 1;
  o.log_level = KDISPATCH_LOG_OFF;
  rt = make_rt(&o);
  kdispatch_lookup_query_init(&q);
  q.op = "triton_fused_moe";
  q.key = "E=8,N=16,dtype=fp8_w8a8";
  q.device = "NVIDIA_H200";
  q.M = 1;
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"default\"");
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_lookup_table(rt, &q, &json));
  CONTAINS(json, "\"rows\": {\"256\": {\"BLOCK_SIZE_M\": 64, ");
  CONTAINS(json, "\"512\": {\"BLOCK_SIZE_M\": 128, ");
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));

  /* a forced plan: lookup says so; no table applies */
  const char* force[1] = {"rmsnorm=rmsnorm_fp32__ref"};
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.force = force;
  o.force_count = 1;
  o.log_level = KDISPATCH_LOG_OFF;
  rt = make_rt(&o);
  kdispatch_lookup_query_init(&q);
  q.op = "rmsnorm";
  q.key = "hidden=64,dtype=fp32";
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"forced\"");
  kdispatch_free(json);
  EXPECT(KDISPATCH_NOT_FOUND, kdispatch_lookup_table(rt, &q, &json));
  float x[64], y[64], w[64];
  for (int i = 0; i < 64; ++i) x[i] = (float)i, w[i] = 1.0f;
  tensor tx = f32_2d(x, 1, 64), ty = f32_2d(y, 1, 64), tw = f32_1d(w, 64);
  kdispatch_dispatch_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, &info));
  CHECK(info.source == 2 && strcmp(info.variant, "rmsnorm_fp32__ref") == 0);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));
}

static void test_env_and_default(void) {
  kdispatch_runtime* rt = (kdispatch_runtime*)&rt;
  char dir[512];
  path_join(dir, sizeof dir, g_tmp, "own-configs");
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create_from_env(NULL, NULL));
  setenv("KDISPATCH_TUNE", "bogus", 1);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create_from_env(NULL, &rt));
  CONTAINS(kdispatch_last_error_message(), "KDISPATCH_TUNE");
  CHECK(rt == NULL);
  unsetenv("KDISPATCH_TUNE");
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.struct_size = 1;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_create_from_env(&o, &rt));

  setenv("KDISPATCH_CONFIG_DIRS", dir, 1);
  setenv("KDISPATCH_LOG_LEVEL", "off", 1);
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  EXPECT(KDISPATCH_OK, kdispatch_runtime_create_from_env(&o, &rt));
  unsetenv("KDISPATCH_CONFIG_DIRS");
  unsetenv("KDISPATCH_LOG_LEVEL");
  kdispatch_lookup_query q;
  kdispatch_lookup_query_init(&q);
  q.op = "rmsnorm";
  q.key = "hidden=64,dtype=fp32";
  char* json = NULL;
  EXPECT(KDISPATCH_OK, kdispatch_lookup(rt, &q, &json));
  CONTAINS(json, "\"match\": \"exact\""); /* the dir from KDISPATCH_CONFIG_DIRS serves */
  kdispatch_free(json);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));

  /* the process-wide default runtime: borrowed, never destroyed */
  kdispatch_runtime* d1 = NULL;
  kdispatch_runtime* d2 = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_default_runtime(NULL));
  EXPECT(KDISPATCH_OK, kdispatch_default_runtime(&d1));
  EXPECT(KDISPATCH_OK, kdispatch_default_runtime(&d2));
  CHECK(d1 != NULL && d1 == d2);
  EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_runtime_destroy(d1));
  float x[2 * 16], y[2 * 16], w[16];
  for (int i = 0; i < 32; ++i) x[i] = (float)(i % 5);
  for (int i = 0; i < 16; ++i) w[i] = 1.0f;
  tensor tx = f32_2d(x, 2, 16), ty = f32_2d(y, 2, 16), tw = f32_1d(w, 16);
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(d1, dl(&ty), dl(&tx), dl(&tw), 1e-6f, NULL, 0, NULL));
}

static void test_last_error_is_per_thread_state(void) {
  kdispatch_runtime* rt = NULL;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_reload(NULL));
  const char* m = kdispatch_last_error_message();
  CONTAINS(m, "rt is NULL");
  (void)kdispatch_status_name(1); /* functions without a status leave it alone */
  (void)kdispatch_version();
  CONTAINS(kdispatch_last_error_message(), "rt is NULL");
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt)); /* a success clears it */
  CHECK(kdispatch_last_error_message()[0] == '\0');
}

/* kdispatch_op_workspace_bytes: a call's tensors (data may be NULL) -> the
 * most workspace any variant of their backend asks; the host's take none. */
static void test_op_workspace_bytes(void) {
  float a[4 * 8], b[8 * 8], d[4 * 8];
  tensor ta = f32_2d(a, 4, 8), tb = f32_2d(b, 8, 8), td = f32_2d(d, 4, 8);
  const DLTensor* t[4] = {dl(&ta), dl(&tb), dl(&td), NULL};
  int64_t bytes = -1;
  EXPECT(KDISPATCH_OK, kdispatch_op_workspace_bytes("gemm", t, 4, NULL, 0, &bytes));
  CHECK(bytes == 0);
  bytes = -1;
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_workspace_bytes("gemm", t, 3, NULL, 0, &bytes));
  CHECK(strcmp(kdispatch_last_error_message(), "gemm takes 4 tensors, got 3") == 0);
  CHECK(bytes == 0); /* cleared before any check that can fail */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_workspace_bytes("gemmm", t, 4, NULL, 0, &bytes));
  CHECK(strcmp(kdispatch_last_error_message(), "kdispatch_op_workspace_bytes: unknown op 'gemmm'") == 0);
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_workspace_bytes("gemm", t, 4, NULL, 0, NULL));
  CONTAINS(kdispatch_last_error_message(), "bytes_out");
  /* a shape the op refuses: the op's own sentence */
  tensor tb_bad = f32_2d(b, 8, 7);
  const DLTensor* t_bad[4] = {dl(&ta), dl(&tb_bad), dl(&td), NULL};
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_op_workspace_bytes("gemm", t_bad, 4, NULL, 0, &bytes));
}

/* g_tmp (and the cache dir in it) removed at exit, an early exit(1) or
   exit(2) too. */
static void remove_tmp(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

int main(void) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/kdispatch-c-api-XXXXXX");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    return 2;
  }
  atexit(remove_tmp);
  /* never the user's tuning cache: run by hand (ctest sets its own), a dir under g_tmp */
  const char* cache = getenv("KDISPATCH_CACHE_DIR");
  if (cache == NULL || *cache == '\0') {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cache", g_tmp);
    setenv("KDISPATCH_CACHE_DIR", dir, 1);
  }
  {
    kdispatch_runtime* rt = NULL;
    kdispatch_options o;
    kdispatch_options_init(&o);
    o.load_shipped_configs = 0;
    o.log_level = KDISPATCH_LOG_OFF;
    char* json = NULL;
    if (kdispatch_runtime_create(&o, &rt) != KDISPATCH_OK ||
        kdispatch_runtime_device_info(rt, kDLCPU, 0, &json) != KDISPATCH_OK) {
      fprintf(stderr, "cannot probe the CPU: %s\n", kdispatch_last_error_message());
      return 2;
    }
    json_string_field(json, "device_name", g_cpu, sizeof g_cpu);
    kdispatch_free(json);
    kdispatch_runtime_destroy(rt);
  }
  test_versions_and_status();
  test_create_errors();
  test_runtime_functions();
  test_ops();
  test_fp8_fast_accum();
  test_op_workspace_bytes();
  test_hostile_tensors_and_flags();
  test_tuning();
  test_lookup();
  test_env_and_default();
  test_last_error_is_per_thread_state();

  printf("test_c_api: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
