/* SPDX-License-Identifier: Apache-2.0 */
/* kdispatch — the C ABI.
 *
 * A C99 interface over libkdispatch for engines and languages that cannot
 * use the C++ API (Python through ctypes, Rust, Go, ...). It is exported from
 * libkdispatch.so itself; include this header and link -lkdispatch.
 *
 *   #include <dispatch/c_api.h>
 *
 *   kdispatch_options o;
 *   kdispatch_options_init(&o);
 *   const char* dirs[] = {"/opt/engine/moe-configs"};
 *   o.config_dirs = dirs;
 *   o.config_dirs_count = 1;
 *   o.backend_version = "3.5.1";
 *   kdispatch_runtime* rt = NULL;
 *   if (kdispatch_runtime_create(&o, &rt) != KDISPATCH_OK)
 *     fprintf(stderr, "%s\n", kdispatch_last_error_message());
 *   kdispatch_rmsnorm(rt, &y, &x, &w, 1e-6f, stream, 0, NULL);   // DLTensor*s
 *   kdispatch_runtime_close(rt, KDISPATCH_CLOSE_DEFAULT_TIMEOUT);   // other threads may still call
 *   kdispatch_runtime_destroy(rt);                                   // once none can
 *
 * Conventions (every function):
 * - Nothing throws across this interface; every entry point catches
 *   everything. Functions that can fail return a kdispatch_status whose
 *   numbers are dispatch::StatusCode's (0 = KDISPATCH_OK).
 * - Error messages: every function that returns a kdispatch_status sets the
 *   calling thread's last error message — the failure's text (naming the
 *   argument, file or variable), or "" on success. Read it with
 *   kdispatch_last_error_message() before the next kdispatch call on the same
 *   thread. Functions that do not return a status (kdispatch_version,
 *   kdispatch_abi_version, kdispatch_status_name, kdispatch_last_error_message,
 *   kdispatch_free, the *_init helpers) leave it alone.
 * - Output parameters are written only on success, except that out-pointers
 *   to handles and strings are set to NULL on failure when they are non-null.
 * - Null pointers: a null `rt` handle, a null required pointer argument
 *   (a DLTensor*, an out-pointer, a string), or a DLTensor whose `shape`
 *   is NULL while ndim > 0 is KDISPATCH_INVALID_ARGUMENT, its message
 *   naming the argument ("a: DLTensor shape is NULL (ndim 2 needs ndim
 *   sizes)"). NULL is accepted only where a function says so (an absent
 *   optional tensor such as bias, `strides` of a DLTensor, `info`, a NULL
 *   options or base struct, `stream`). Pointers are otherwise trusted: a
 *   dangling or too-short buffer is not detected.
 * - A handle closed by kdispatch_runtime_close: every function that takes
 *   it returns KDISPATCH_FAILED_PRECONDITION ("<function>: the runtime was
 *   closed ...") without touching the runtime.
 * - Strings returned to the caller (JSON texts) are allocated by the
 *   library, NUL-terminated UTF-8, owned by the caller, and released with
 *   kdispatch_free().
 * - Tensors are DLPack DLTensor views (dlpack/dlpack.h, DLPack >= 0.6):
 *   `data + byte_offset` is element [0,...]; strides are in elements (NULL =
 *   compact row-major; every (shape - 1) * stride and their sum, in bytes,
 *   from `data + byte_offset`, must stay inside the 64-bit address space,
 *   below 2^57, computed without overflow: a size, stride or byte_offset
 *   past it is INVALID_ARGUMENT "<arg>: DLTensor size or stride overflows:
 *   ..." or "<arg>: DLTensor data + byte_offset overflows ..."); kDLFloat 32 / kDLFloat 16 / kDLBfloat 16 /
 *   kDLInt 32 and DLPack 1.1's fp8 codes (10 kDLFloat8_e4m3fn, 11
 *   kDLFloat8_e4m3fnuz, 12 kDLFloat8_e5m2; bits 8) with lanes 1; kDLCPU/kDLCUDAHost (host), kDLCUDA, kDLROCM. No data
 * is copied and nothing is retained after the call returns (for a GPU tensor, the memory must stay valid until the work
 * queued on `stream` is done).
 * - Thread-safety: as the C++ API. Ops, lookups and stats may run
 *   concurrently on one runtime from any number of threads; reload and
 *   freeze may run concurrently with them. kdispatch_runtime_close may run
 *   concurrently with any of them (they then fail with
 *   KDISPATCH_FAILED_PRECONDITION or finish first); kdispatch_runtime_destroy
 *   frees the handle itself, so a call that *starts* after it is a
 *   use-after-free (close first when other threads may still call).
 *
 * Versioning: KDISPATCH_ABI_VERSION is the version of this header's ABI;
 * kdispatch_abi_version() is the version the loaded library implements.
 * They must be equal (check once at start-up; a Python/ctypes binding does).
 * Additions that keep old callers working — new functions, new fields
 * appended to the structs that carry a `struct_size`, new flag bits, new
 * status codes — do not change it; a removal or a change of meaning does.
 * Structs with `struct_size` must be filled with their *_init function (or
 * zeroed and given struct_size = sizeof), so a library can tell which fields
 * an older caller knows.
 */
#ifndef KDISPATCH_C_API_H
#define KDISPATCH_C_API_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#if defined(_WIN32)
#if defined(KDISPATCH_BUILDING)
#define KDISPATCH_C_API __declspec(dllexport)
#else
#define KDISPATCH_C_API __declspec(dllimport)
#endif
#else
#define KDISPATCH_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** ABI version of this header. */
#define KDISPATCH_ABI_VERSION 1

/* ------------------------------------------------------------------ status */

/** Status codes: the numbers of dispatch::StatusCode. */
typedef int32_t kdispatch_status;
#define KDISPATCH_OK 0
#define KDISPATCH_INVALID_ARGUMENT 1     /* null pointer, bad shape/stride/dtype name, eps <= 0, bad struct_size */
#define KDISPATCH_UNSUPPORTED_PROBLEM 2  /* well formed, but nothing in this build computes it (dtype) */
#define KDISPATCH_UNSUPPORTED_DEVICE 3   /* tensor on a device whose backend is not in this build */
#define KDISPATCH_NO_VARIANT 4           /* a forced variant that does not exist or declines */
#define KDISPATCH_CONFIG_ERROR 5         /* an invalid config (file, row, value, force entry) */
#define KDISPATCH_BACKEND_ERROR 6        /* CUDA/HIP/BLAS error; the message has its code */
#define KDISPATCH_OUT_OF_MEMORY 7        /* host or device allocation failed */
#define KDISPATCH_NOT_FOUND 8            /* a lookup found nothing */
#define KDISPATCH_INTERNAL 9             /* a bug in kdispatch */
#define KDISPATCH_IO_ERROR 10            /* a file could not be read or written */
#define KDISPATCH_FAILED_PRECONDITION 11 /* not allowed in this state (frozen runtime, default runtime) */

/** The stable lower-case name of a code ("ok", "invalid_argument", ...);
 *  "unknown" for a number that is not a code. Never NULL; static storage. */
KDISPATCH_C_API const char* kdispatch_status_name(kdispatch_status code);

/** The calling thread's last error message (see Conventions): "" after a
 *  success. Never NULL. Valid until the next kdispatch call on this thread. */
KDISPATCH_C_API const char* kdispatch_last_error_message(void);

/* ---------------------------------------------------------------- versions */

/** The ABI version the loaded library implements (KDISPATCH_ABI_VERSION of
 *  the header it was built with). */
KDISPATCH_C_API int32_t kdispatch_abi_version(void);

/** The library version, "MAJOR.MINOR.PATCH". Static storage. */
KDISPATCH_C_API const char* kdispatch_version(void);

/** Releases a string returned by kdispatch. NULL is a no-op. */
KDISPATCH_C_API void kdispatch_free(void* p);

/* ----------------------------------------------------------------- options */

/** Online tuning mode (dispatch::TuneMode). */
typedef enum kdispatch_tune_mode {
  KDISPATCH_TUNE_OFF = 0,       /* table + get_default only */
  KDISPATCH_TUNE_SYNC = 1,      /* a miss is tuned on the calling thread, then served */
  KDISPATCH_TUNE_BACKGROUND = 2 /* a miss is served by get_default and queued for a tuner thread */
} kdispatch_tune_mode;

/** Log level of messages written to stderr (dispatch::LogLevel). */
typedef enum kdispatch_log_level {
  KDISPATCH_LOG_OFF = 0,
  KDISPATCH_LOG_ERROR = 1,
  KDISPATCH_LOG_WARN = 2,
  KDISPATCH_LOG_INFO = 3,
  KDISPATCH_LOG_DEBUG = 4
} kdispatch_log_level;

/** Runtime options: dispatch::RuntimeOptions. Fill with kdispatch_options_init,
 *  then set what differs. Strings are copied at create time; NULL or "" =
 *  the default. Arrays are (pointer, count); NULL with count 0 = none. */
typedef struct kdispatch_options {
  uint32_t struct_size; /* sizeof(kdispatch_options), set by init */
  /* Extra config dirs, highest precedence first (SGLang/vLLM trees as they are). */
  const char* const* config_dirs;
  size_t config_dirs_count;
  int32_t load_shipped_configs;    /* 1 (default): load kdispatch's shipped configs */
  const char* shipped_configs_dir; /* override for the shipped dir */
  const char* backend_version;     /* triton.__version__, picks triton_X_Y_Z/ folders */
  /* Device-name aliases: alias_from[i] -> alias_to[i] (e.g. "NVIDIA H200 NVL" -> "NVIDIA_H200"). */
  const char* const* alias_from;
  const char* const* alias_to;
  size_t aliases_count;
  int32_t bounded_nearest; /* 0 (default): nearest M always serves */
  double bound_ratio;      /* 2.0 */
  int32_t log_level;       /* kdispatch_log_level; KDISPATCH_LOG_WARN */
  int32_t watch;           /* 1: reload on config-dir changes (inotify) */
  /* Forced plans, "<op>=<variant>[:<param>=<v>,...]" each. */
  const char* const* force;
  size_t force_count;
  int32_t deterministic; /* 1: never serve scheduling-dependent variants */
  /* Tuning (dispatch::TuneOptions). */
  int32_t tune_mode;                /* kdispatch_tune_mode; KDISPATCH_TUNE_OFF */
  const char* cache_dir;            /* NULL: $KDISPATCH_CACHE_DIR, $XDG_CACHE_HOME/kdispatch, ~/.cache/kdispatch */
  int32_t tune_persist;             /* 1 */
  int32_t tune_load_cache;          /* 1 */
  int64_t tune_memory_budget_bytes; /* 1 GiB */
  double tune_time_budget_ms;       /* 2000 */
  double tune_duty_cycle;           /* 0.5 */
  int32_t tune_reps;                /* 5 */
  int32_t tune_max_candidates;      /* 96 */
  int32_t tune_queue_capacity;      /* 1024 */
  int32_t tune_validate;            /* 1 */
  int32_t tune_cold_cache;          /* 1 */
  int32_t tune_claim_shapes;        /* 1 */
  /* Appended (a caller built against the struct without it links to the
   * kdispatch_options_init symbol, which fills that shorter struct with its
   * struct_size, offsetof(kdispatch_options, tune_routing); it gets the
   * default): the expert ids MoE ops (fused_moe) are tuned on:
   * NULL or "uniform", "skewed", or the path of an .npy of int32
   * [tokens, top_k] ids dumped from a server (TuneOptions::routing; a bad
   * file fails kdispatch_runtime_create naming it). */
  const char* tune_routing;
} kdispatch_options;

/** Fills the first `size` bytes of `o` with the defaults of
 *  dispatch::RuntimeOptions and sets struct_size = size: `size` is the
 *  caller's sizeof(kdispatch_options), which the kdispatch_options_init
 *  macro passes, so a caller built against an older, shorter struct is
 *  never written past its end. A size that is no version of the struct is
 *  written as far as both reach and refused by kdispatch_runtime_create.
 *  NULL is a no-op. */
KDISPATCH_C_API void kdispatch_options_init_sized(kdispatch_options* o, size_t size);
/** The exported symbol callers built before tune_routing was appended link
 *  to: fills that older, shorter struct (struct_size =
 *  offsetof(kdispatch_options, tune_routing)). New code gets the macro
 *  below, which passes its own sizeof. NULL is a no-op. */
KDISPATCH_C_API void kdispatch_options_init(kdispatch_options* o);
#define kdispatch_options_init(o) kdispatch_options_init_sized((o), sizeof *(o))

/* ----------------------------------------------------------------- runtime */

/** An opaque runtime: a loaded, immutable dispatch table plus its options
 *  (dispatch::Runtime). */
typedef struct kdispatch_runtime kdispatch_runtime;

/** Creates a runtime from `options` (NULL = all defaults) and loads its
 *  config dirs. A bad or foreign config file never fails creation (it is
 *  skipped and listed in the load report).
 *  Errors: INVALID_ARGUMENT (out == NULL; struct_size not a known size;
 *  a config dir that does not exist or is not a directory, naming it; a
 *  tune_mode/log_level out of range; a count > 0 with a NULL array or a NULL
 *  entry), NO_VARIANT / CONFIG_ERROR (a bad force entry), OUT_OF_MEMORY. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_create(const kdispatch_options* options, kdispatch_runtime** out);

/** Creates a runtime from the KDISPATCH_* environment on top of `base`
 *  (NULL = defaults): KDISPATCH_CONFIG_DIRS, KDISPATCH_SHIPPED_CONFIGS,
 *  KDISPATCH_BACKEND_VERSION, KDISPATCH_LOG_LEVEL, KDISPATCH_WATCH,
 *  KDISPATCH_FORCE, KDISPATCH_DETERMINISTIC, KDISPATCH_TUNE,
 *  KDISPATCH_CACHE_DIR, KDISPATCH_TUNE_MEM, KDISPATCH_TUNE_BUDGET_MS. Config
 *  dirs from the environment come after base's; one of KDISPATCH_CONFIG_DIRS
 *  that does not exist or is not a directory is skipped and said once per
 *  process on stderr (dispatch::options_from_env).
 *  Errors: as kdispatch_runtime_create, plus INVALID_ARGUMENT naming a
 *  variable whose value is malformed. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_create_from_env(const kdispatch_options* base,
                                                                   kdispatch_runtime** out);

/** The process-wide runtime configured from the environment
 *  (dispatch::default_runtime()), built on first use. The handle is
 *  borrowed: it lives until exit, and destroying it is refused.
 *  Errors: INVALID_ARGUMENT (out == NULL); the error that building it
 *  failed with (every call returns the same one). */
KDISPATCH_C_API kdispatch_status kdispatch_default_runtime(kdispatch_runtime** out);

/** kdispatch_runtime_close's timeout_s for its default wait, 10 s. */
#define KDISPATCH_CLOSE_DEFAULT_TIMEOUT (-1.0)

/** Closes a runtime made by a create function, safely while other threads
 *  still call it: from the moment close starts, a new call through `rt`
 *  (any function taking the handle) returns FAILED_PRECONDITION at once
 *  ("the runtime was closed") without touching the runtime; close then
 *  waits for the calls already in flight on `rt` to return, at most
 *  timeout_s seconds (negative, KDISPATCH_CLOSE_DEFAULT_TIMEOUT: 10 s;
 *  0: no wait), and then destroys the runtime (its tuner and watcher
 *  threads are joined, its memory freed). The handle itself stays valid
 *  (a few hundred bytes) until kdispatch_runtime_destroy, so a late call
 *  through it is refused, never a use-after-free. Closing a closed runtime
 *  is OK (a no-op); concurrent closes wait for each other. Calls in flight
 *  are counted per calling thread, on each thread's own cache line: a call
 *  pays no shared atomic write.
 *  Errors: INVALID_ARGUMENT (rt NULL, timeout_s NaN), FAILED_PRECONDITION
 *  (the default runtime: left alive and open; or calls still in flight
 *  when the timeout passed, their count in the message: the runtime is
 *  left alive and closed to new calls, and a later close waits again). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_close(kdispatch_runtime* rt, double timeout_s);

/** Closes `rt` (kdispatch_runtime_close with the default 10 s wait) and
 *  frees the handle. NULL is a no-op (OK). After an OK return the handle
 *  is gone: no thread may pass it again (a call that starts after the
 *  free is a use-after-free). To stop other threads that may still call,
 *  close first, and destroy once none can pass the handle any more.
 *  Errors: FAILED_PRECONDITION for the default runtime (left alive), or
 *  calls still in flight after 10 s (nothing freed; the runtime is closed
 *  to new calls). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_destroy(kdispatch_runtime* rt);

/** For a language binding at interpreter exit (Python's atexit): from this
 *  call on, a call through any runtime handle on another thread blocks that
 *  thread forever, at its start, or at its end when it was in flight,
 *  instead of running or returning, and the process exits around it; this
 *  function waits (at most 2 s) until every such call has parked or
 *  returned. Calls on the calling thread go on as before. Why: a daemon
 *  thread returning into an interpreter that is finalizing is ended by a
 *  forced unwind (pthread_exit), which a C++ noexcept frame of the caller's
 *  (torch's GIL guards) turns into std::terminate (SIGABRT at exit); one
 *  still running while the process runs its static destructors uses what
 *  they free (SIGSEGV). Not undone. Thread-safe; costs other calls two
 *  shared reads. */
KDISPATCH_C_API void kdispatch_park_calls_at_exit(void);

/** Re-reads every config dir and atomically publishes a new table; on a
 *  failure the old table keeps serving. Readers are never blocked.
 *  Errors: INVALID_ARGUMENT (rt == NULL), FAILED_PRECONDITION (the runtime
 *  is frozen: the table does not change), OUT_OF_MEMORY, INTERNAL. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_reload(kdispatch_runtime* rt);

/** Gives `stream` of GPU device (device_type kDLCUDA = 2 or kDLROCM = 10,
 *  ordinal) a workspace of `workspace_bytes` (allocated now, freed with
 *  the runtime; 33554432 = 32 MiB is torch's cuBLAS size on Hopper): gemm
 *  calls on that stream can then run split-K plans, fused_moe its
 *  tensor-core plans and moe_gemm block fp8's ring where it fits. Call when the stream is
 *  set up, not while it is captured. Errors: INVALID_ARGUMENT (rt NULL, a
 *  non-GPU device_type, bytes < 0), UNSUPPORTED_DEVICE, OUT_OF_MEMORY. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_attach_stream(kdispatch_runtime* rt, int32_t device_type,
                                                                 int32_t ordinal, void* stream,
                                                                 int64_t workspace_bytes);

/** Stops (frozen != 0) or resumes (0) all tuning and table changes: no
 *  search starts, reload and the watcher publish nothing.
 *  Errors: INVALID_ARGUMENT (rt == NULL). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_freeze(kdispatch_runtime* rt, int32_t frozen);

/** Whether the runtime is frozen: *out = 1 or 0.
 *  Errors: INVALID_ARGUMENT (rt or out NULL). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_frozen(const kdispatch_runtime* rt, int32_t* out);

/** The report of the most recent (re)load as JSON (LoadReport::to_json:
 *  {"files": [{"path", "dir", "status", "rows", "problems", ...}], "notes",
 *  "keys", "rows"}). *json_out is caller-owned (kdispatch_free).
 *  Errors: INVALID_ARGUMENT (rt or json_out NULL), OUT_OF_MEMORY. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_load_report(const kdispatch_runtime* rt, char** json_out);

/** The tuning cache dir in use ("" when tuning and the cache are off), as a
 *  caller-owned string (kdispatch_free).
 *  Errors: INVALID_ARGUMENT (rt or out NULL), OUT_OF_MEMORY. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_cache_dir(const kdispatch_runtime* rt, char** out);

/** A device description as JSON: {"device_type", "ordinal", "device_name",
 *  "reported_name", "arch", "compute_units", "memory_bytes", "l2_bytes",
 *  "smem_per_block_bytes", "warp_size", "available", "unavailable_reason"}.
 *  device_type is a DLDeviceType (kDLCPU, kDLCUDA, kDLROCM).
 *  Errors: INVALID_ARGUMENT (rt or json_out NULL), UNSUPPORTED_DEVICE (a
 *  device type or ordinal this build has no backend or device for). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_device_info(const kdispatch_runtime* rt, int32_t device_type,
                                                               int32_t ordinal, char** json_out);

/** Tuning counters (dispatch::TuneStats). */
typedef struct kdispatch_tune_stats {
  uint32_t struct_size; /* set by the caller: sizeof(kdispatch_tune_stats) */
  int64_t misses;
  int64_t queued;
  int64_t dropped;
  int64_t shapes_tuned;
  int64_t shapes_skipped;
  int64_t candidates_run;
  int64_t candidates_rejected;
  int64_t candidates_failed;
  int64_t publishes;
  int64_t pending;
  double tune_seconds;
  int32_t frozen;
  /* Since 0.2 (the struct grew; a caller built against the older header
   * passes its smaller struct_size and gets the fields above only): */
  int64_t deferred;      /* sync mode: misses seen during a graph capture, waiting */
  int64_t capture_waits; /* background mode: waits for a graph capture to end */
} kdispatch_tune_stats;

/** Fills *out (whose struct_size the caller set to sizeof). A struct_size of
 *  an older header (up to `frozen`) is accepted: only its fields are set.
 *  Errors: INVALID_ARGUMENT (rt or out NULL, struct_size not a known size). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_tune_stats(const kdispatch_runtime* rt, kdispatch_tune_stats* out);

/** Waits until the background tuner is idle or timeout_s passed; *idle = 1
 *  when idle (always 1 without a background tuner). For tools and tests.
 *  Errors: INVALID_ARGUMENT (rt or idle NULL, timeout_s < 0 or NaN). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_wait_tuner_idle(kdispatch_runtime* rt, double timeout_s,
                                                                   int32_t* idle);

/** Writes the shapes that missed the table so far as an untuned-shapes CSV.
 *  Errors: INVALID_ARGUMENT (rt or path NULL/empty), IO_ERROR naming the path. */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_export_misses(const kdispatch_runtime* rt, const char* path);

/* --------------------------------------------------------------------- ops */

/** Flags of an op call (bitwise or). Any other bit is INVALID_ARGUMENT
 *  ("flags: unknown bits 0x..."): a library older than the caller's header
 *  says so rather than ignore a flag it does not know. */
#define KDISPATCH_CALL_CAPTURING                            \
  1u /* the stream is being captured into a CUDA/HIP graph: \
        never benchmark, synchronise or allocate */
#define KDISPATCH_CALL_FAST_ACCUM                               \
  2u /* the fp8 GEMMs: fast accumulation (their fast_accum      \
        switch; key accum=fast; see kdispatch_gemm_fp8_tensor). \
        INVALID_ARGUMENT for an op without the switch */

/** Where the plan of one call came from (dispatch::DispatchInfo). */
typedef struct kdispatch_dispatch_info {
  uint32_t struct_size; /* set by the caller: sizeof(kdispatch_dispatch_info) */
  int32_t source;       /* 0 table (hit), 1 default (miss), 2 forced */
  const char* variant;  /* variant name, static storage ("gemm_fp32__blocked") */
  int64_t table_m;      /* the table's M key that served, -1 for a default plan */
  uint32_t source_id;   /* config source of the row (0 for a default); see kdispatch_runtime_source_path */
  int32_t tuned_now;    /* 1 when the call tuned the shape itself (sync tuning) */
  /* Since 0.1 of 2026-12: non-empty when an engine's tuned row shaped the
     default plan (fused_moe with SGLang's fused-MoE files and no kdispatch
     row): "sglang file without K"; table_m and source_id then name that
     row. Static storage. A caller built before it passes the struct's old
     size (offsetof(kdispatch_dispatch_info, k_source)): accepted, not written. */
  const char* k_source;
} kdispatch_dispatch_info;

/** The config file (relative to its dir) and its dir of a source id from
 *  kdispatch_dispatch_info, as caller-owned strings (either out may be NULL
 *  when not wanted). Errors: INVALID_ARGUMENT (rt NULL, both outs NULL),
 *  NOT_FOUND (an unknown id). */
KDISPATCH_C_API kdispatch_status kdispatch_runtime_source_path(const kdispatch_runtime* rt, uint32_t source_id,
                                                               char** path_out, char** dir_out);

/** D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]); bias may be NULL. B is the weight
 *  row-major as torch.nn.Linear stores it. `stream` is a cudaStream_t /
 *  hipStream_t (NULL = default stream), ignored for host tensors (the work
 *  is done on return). `flags`: KDISPATCH_CALL_*. `info` may be NULL.
 *  Errors: INVALID_ARGUMENT (rt/a/b/d NULL, a NULL shape, null data, rank,
 *  shapes that disagree, strides, a size/stride/byte_offset that overflows;
 *  naming the argument; a non-NULL bias whose data is NULL; flag bits other
 *  than KDISPATCH_CALL_*: "flags: unknown bits 0x..."), FAILED_PRECONDITION
 *  (a closed runtime), UNSUPPORTED_PROBLEM (a dtype or
 *  dtype combination not computed), UNSUPPORTED_DEVICE (a device with no
 *  backend here, or tensors on different devices), BACKEND_ERROR,
 *  INVALID_ARGUMENT (info with a bad struct_size). */
KDISPATCH_C_API kdispatch_status kdispatch_gemm(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                const DLTensor* d, const DLTensor* bias, void* stream, uint32_t flags,
                                                kdispatch_dispatch_info* info);

/** kdispatch_gemm with a workspace for this call: `workspace_bytes` of
 *  device memory on the tensors' device, used in stream order on `stream`
 *  by this call only (cuBLASLt's and the tiled family's split-K). NULL/0:
 *  the workspace kdispatch_runtime_attach_stream gave `stream`, else none;
 *  a plan that needs more falls back to the default plan inside the call.
 *  Errors: as kdispatch_gemm, plus INVALID_ARGUMENT for workspace_bytes < 0
 *  or a NULL workspace with workspace_bytes != 0. */
KDISPATCH_C_API kdispatch_status kdispatch_gemm_ws(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                   const DLTensor* d, const DLTensor* bias, void* workspace,
                                                   int64_t workspace_bytes, void* stream, uint32_t flags,
                                                   kdispatch_dispatch_info* info);

/** y = x / sqrt(mean(x^2) + eps) * w, per row. x, y: [tokens, hidden]
 *  (unit stride along hidden; y may alias x with the same row stride);
 *  w: [hidden]. Errors: as kdispatch_gemm, plus INVALID_ARGUMENT for
 *  eps <= 0. */
KDISPATCH_C_API kdispatch_status kdispatch_rmsnorm(kdispatch_runtime* rt, const DLTensor* y, const DLTensor* x,
                                                   const DLTensor* w, float eps, void* stream, uint32_t flags,
                                                   kdispatch_dispatch_info* info);

/** In place, as vLLM/SGLang: residual += x (rounded to the storage dtype);
 *  x = rmsnorm(residual) * w. Errors: as kdispatch_rmsnorm, plus
 *  INVALID_ARGUMENT when x and residual overlap. */
KDISPATCH_C_API kdispatch_status kdispatch_fused_add_rmsnorm(kdispatch_runtime* rt, const DLTensor* x,
                                                             const DLTensor* residual, const DLTensor* w, float eps,
                                                             void* stream, uint32_t flags,
                                                             kdispatch_dispatch_info* info);

/** out[t, i] = silu(x[t, i]) * x[t, d + i] (vLLM/SGLang's silu_and_mul(out,
 *  input)): x [tokens, 2*d], out [tokens, d], one dtype, unit stride along
 *  the last dim, out not overlapping x. Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_silu_and_mul(kdispatch_runtime* rt, const DLTensor* out, const DLTensor* x,
                                                        void* stream, uint32_t flags, kdispatch_dispatch_info* info);

/** The fp8 GEMMs (dispatch::GemmFp8Args): d[M,N] = (a ⊙ scale_a) · (b ⊙
 *  scale_b)^T (+ bias[N]); a [M,K] and b [N,K] fp8 (DLPack 1.1 code 10,
 *  kDLFloat8_e4m3fn, bits 8), scales fp32: _tensor [1] and [1]; _rowwise
 *  [M] and [N]; _block [ceil(K/128), M] (M-major, row stride >= M; or
 *  K-major as the column-major view, strides {1, >= ceil(K/128)}) and
 *  [ceil(N/128), ceil(K/128)]. bias may be NULL. fp32 accumulation; with
 *  KDISPATCH_CALL_FAST_ACCUM in `flags`, fast accumulation (the op's
 *  fast_accum switch, GemmFp8Args::fast_accum: cuBLASLt's FAST_ACCUM where
 *  it serves; a key field, accum=fast). kdispatch_op_call takes the switch as
 *  the op's one scalar (0 or 1; n_scalars 0 leaves it off);
 *  kdispatch_op_pretune tunes a fast problem (scalars {1}). Errors: as
 *  kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_gemm_fp8_tensor(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                           const DLTensor* d, const DLTensor* scale_a,
                                                           const DLTensor* scale_b, const DLTensor* bias, void* stream,
                                                           uint32_t flags, kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_gemm_fp8_rowwise(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                            const DLTensor* d, const DLTensor* scale_a,
                                                            const DLTensor* scale_b, const DLTensor* bias, void* stream,
                                                            uint32_t flags, kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_gemm_fp8_block(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                          const DLTensor* d, const DLTensor* scale_a,
                                                          const DLTensor* scale_b, const DLTensor* bias, void* stream,
                                                          uint32_t flags, kdispatch_dispatch_info* info);

/** fp8 activation quantisation (dispatch::QuantFp8Args): q [M,K] fp8
 *  (code 10, bits 8) and fp32 scales from x [M,K] fp32 or bf16: _tensor
 *  scale [1], _token [M], _group [ceil(K/128), M] (M-major). The outputs
 *  (q, scale) may not overlap x or each other. Errors: as kdispatch_gemm
 *  ("scale: overlaps an input (x)"). */
KDISPATCH_C_API kdispatch_status kdispatch_quant_fp8_tensor(kdispatch_runtime* rt, const DLTensor* q, const DLTensor* x,
                                                            const DLTensor* scale, void* stream, uint32_t flags,
                                                            kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_quant_fp8_token(kdispatch_runtime* rt, const DLTensor* q, const DLTensor* x,
                                                           const DLTensor* scale, void* stream, uint32_t flags,
                                                           kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_quant_fp8_group(kdispatch_runtime* rt, const DLTensor* q, const DLTensor* x,
                                                           const DLTensor* scale, void* stream, uint32_t flags,
                                                           kdispatch_dispatch_info* info);

/** A Mixture-of-Experts layer's experts (dispatch::FusedMoeArgs): hidden
 *  [M, H]; w1 [E, 2I, H] and w2 [E, H, I] (experts stacked densely); topk_weights
 *  [M, top_k] fp32; topk_ids [M, top_k] int32 (an id outside [0, E)
 *  contributes nothing); out [M, H]; w1_scale/w2_scale fp32 block scales
 *  exactly when w1/w2 are fp8_e4m3fn (else NULL). activation: 0 silu, 1
 *  gelu (an integer passed as a float). Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_fused_moe(kdispatch_runtime* rt, const DLTensor* hidden, const DLTensor* w1,
                                                     const DLTensor* w2, const DLTensor* topk_weights,
                                                     const DLTensor* topk_ids, const DLTensor* out,
                                                     const DLTensor* w1_scale, const DLTensor* w2_scale,
                                                     float routed_scaling_factor, float activation, void* stream,
                                                     uint32_t flags, kdispatch_dispatch_info* info);

/** The top-k reduction of a Mixture-of-Experts layer (dispatch::MoeSumArgs,
 *  vLLM's moe_sum(input, output)): out[t, h] = routed_scaling_factor *
 *  sum_j input[t, j, h], j ascending, fp32 accumulation. input [M, top_k,
 *  hidden] (tokens stacked densely), out [M, hidden], one dtype (bf16, fp16,
 *  fp32), unit stride along hidden, out not overlapping input;
 *  routed_scaling_factor > 0 and finite (1: vLLM's). Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_moe_sum(kdispatch_runtime* rt, const DLTensor* input, const DLTensor* out,
                                                   float routed_scaling_factor, void* stream, uint32_t flags,
                                                   kdispatch_dispatch_info* info);

/** A Mixture-of-Experts layer's (token, choice) pairs sorted by expert and
 *  padded to blocks (dispatch::MoeAlignArgs; vLLM's moe_align_block_size).
 *  topk_ids [M, top_k] int32; sorted_token_ids int32 of at least M*top_k +
 *  min(num_experts, M*top_k)*(block_size - 1) elements; expert_ids int32 of
 *  at least ceil(that / block_size); num_tokens_post_pad [1] int32;
 *  expert_map [num_experts] int32 or NULL. num_experts and block_size:
 *  whole numbers in [1, 2^24] passed as floats. Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_moe_align(kdispatch_runtime* rt, const DLTensor* topk_ids,
                                                     const DLTensor* sorted_token_ids, const DLTensor* expert_ids,
                                                     const DLTensor* num_tokens_post_pad, const DLTensor* expert_map,
                                                     float num_experts, float block_size, void* stream, uint32_t flags,
                                                     kdispatch_dispatch_info* info);

/** One grouped GEMM of a Mixture-of-Experts layer over moe_align's sorted
 *  pairs (dispatch::MoeGemmArgs; SGLang's and vLLM's fused_moe_kernel):
 *  out[s] = (a[s / top_k] . w[e]^T) * (mul_routed_weight ? topk_weights[s]
 *  : 1) for the pairs s of each block, e = expert_ids[block], 0 where e is
 *  not local. a [M, K]; w [E, N, K] (the dtype of a, or fp8_e4m3fn with
 *  w_scale [E, ceil(N/128), ceil(K/128)] fp32, else NULL); out [M, top_k,
 *  N]; topk_weights [M, top_k] fp32; sorted_token_ids,
 *  expert_ids, num_tokens_post_pad as kdispatch_moe_align writes them.
 *  top_k, block_size: whole numbers in [1, 2^24]; mul_routed_weight 0 or
 *  1; all passed as floats. Block fp8's wgmma and ring kernels
 *  (moe_gemm_fp8_e4m3fn__wgmma, __ring) quantise a into a workspace: this
 *  entry point passes none, so give the
 *  stream one (kdispatch_runtime_attach_stream) or call through
 *  kdispatch_op_call with one of kdispatch_op_workspace_bytes; without it
 *  the split kernels run (correct, slower; info still names the plan).
 *  Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_moe_gemm(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w,
                                                    const DLTensor* out, const DLTensor* topk_weights,
                                                    const DLTensor* sorted_token_ids, const DLTensor* expert_ids,
                                                    const DLTensor* num_tokens_post_pad, const DLTensor* w_scale,
                                                    float top_k, float block_size, float mul_routed_weight,
                                                    void* stream, uint32_t flags, kdispatch_dispatch_info* info);

/** moe_gemm on fp8_e4m3fn weights with SGLang's per-tensor or per-channel
 *  scales (dispatch::MoeGemmFp8Args): as kdispatch_moe_gemm, with w_scale
 *  [E] (tensor) or [E, N] (channel) fp32 and a_scale [1] fp32 (static) or
 *  NULL (dynamic: one scale for all of a, resp. one per row). a and out
 *  bf16 or fp32 (CUDA: bf16). Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_moe_gemm_fp8_tensor(
    kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w, const DLTensor* out, const DLTensor* topk_weights,
    const DLTensor* sorted_token_ids, const DLTensor* expert_ids, const DLTensor* num_tokens_post_pad,
    const DLTensor* w_scale, const DLTensor* a_scale, float top_k, float block_size, float mul_routed_weight,
    void* stream, uint32_t flags, kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_moe_gemm_fp8_channel(
    kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w, const DLTensor* out, const DLTensor* topk_weights,
    const DLTensor* sorted_token_ids, const DLTensor* expert_ids, const DLTensor* num_tokens_post_pad,
    const DLTensor* w_scale, const DLTensor* a_scale, float top_k, float block_size, float mul_routed_weight,
    void* stream, uint32_t flags, kdispatch_dispatch_info* info);

/** fused_moe on fp8_e4m3fn weights with SGLang's per-tensor or per-channel
 *  scales (dispatch::FusedMoeFp8Args): as kdispatch_fused_moe, with
 *  w1_scale, w2_scale [E] (tensor) or [E, 2I], [E, H] (channel) fp32 and
 *  a1_scale, a2_scale [1] fp32 (static) or both NULL (dynamic: per tensor,
 *  resp. per token and per pair). hidden and out bf16 or fp32 (CUDA:
 *  bf16). Errors: as kdispatch_gemm. */
KDISPATCH_C_API kdispatch_status kdispatch_fused_moe_fp8_tensor(
    kdispatch_runtime* rt, const DLTensor* hidden, const DLTensor* w1, const DLTensor* w2, const DLTensor* topk_weights,
    const DLTensor* topk_ids, const DLTensor* out, const DLTensor* w1_scale, const DLTensor* w2_scale,
    const DLTensor* a1_scale, const DLTensor* a2_scale, float routed_scaling_factor, float activation, void* stream,
    uint32_t flags, kdispatch_dispatch_info* info);
KDISPATCH_C_API kdispatch_status kdispatch_fused_moe_fp8_channel(
    kdispatch_runtime* rt, const DLTensor* hidden, const DLTensor* w1, const DLTensor* w2, const DLTensor* topk_weights,
    const DLTensor* topk_ids, const DLTensor* out, const DLTensor* w1_scale, const DLTensor* w2_scale,
    const DLTensor* a1_scale, const DLTensor* a2_scale, float routed_scaling_factor, float activation, void* stream,
    uint32_t flags, kdispatch_dispatch_info* info);

/* ------------------------------------------------------------------ any op */

/** The ops of this build and their arguments, as JSON (caller-owned):
 *  [{"name", "doc", "args": [{"name", "read", "written", "rank", "optional",
 *  "rows": {"dim", "mul", "div"}, "cols": {...}, "alias_of", "dtype"}],
 *  "scalars": [{"name", "default", "kind"}], "key_fields": [{"name", "kind",
 *  "csv_name", "file_pos"}], "m_name", "workspace", "in_dtypes",
 *  "default_out_dtype"}] (dtype:
 *  "in", "out" or a fixed dtype such as "fp32"; in_dtypes: the input
 *  dtypes some variant of this build computes; default_out_dtype: the
 *  dtype a binding gives "out" arguments it allocates, "" = the input
 *  dtype; file_pos: the
 *  field's place before device_name in a file name, -1 after it; a
 *  scalar's kind: "float" (eps), or "bool", a switch: 0 or 1 as a float,
 *  which a scalar list may leave out at its end, off). kdispatch_<name>
 *  takes the args (const DLTensor*, NULL for an absent optional one) and
 *  then the "float" scalars in this order (a "bool" one is a flag bit of
 *  its call: fast_accum, KDISPATCH_CALL_FAST_ACCUM); kdispatch_op_call and
 *  kdispatch_op_pretune take every scalar; bindings generate their methods
 *  from it; "int": a size (moe_align's num_experts, block_size), a whole
 *  number in [1, 2^24] as a float. rows/cols: the extent as mul * dim / div
 *  (rounded up) of the op's named dims; a rank-1 argument with "computed":
 *  true has a formula as its cols "dim" (the caller allocates it) and
 *  "at_least": true when it may be longer. Errors: INVALID_ARGUMENT
 *  (json_out NULL). */
KDISPATCH_C_API kdispatch_status kdispatch_op_list(char** json_out);

/** The most tensors (the fp8_w8a8 fused_moe ops: 10) and scalars an op of
 *  kdispatch_op_list takes: a binding that holds a call's tensors in fixed
 *  arrays sizes them by these (kdispatch_op_call refuses more). */
#define KDISPATCH_MAX_OP_TENSORS 12
#define KDISPATCH_MAX_OP_SCALARS 4

/** Any op by name (kdispatch_op_list), its tensors and scalars in argument
 *  order (trailing "bool" scalars may be left out: off; `flags` as
 *  kdispatch_<op>'s, KDISPATCH_CALL_FAST_ACCUM turning fast_accum on): the
 *  same call as kdispatch_<op>, with a workspace as kdispatch_gemm_ws takes
 *  it (ignored by ops without one). Errors: INVALID_ARGUMENT (an unknown op,
 *  a count the op does not take, a switch other than 0 or 1, naming it),
 *  then as the op. */
KDISPATCH_C_API kdispatch_status kdispatch_op_call(kdispatch_runtime* rt, const char* op,
                                                   const DLTensor* const* tensors, int32_t n_tensors,
                                                   const float* scalars, int32_t n_scalars, void* workspace,
                                                   int64_t workspace_bytes, void* stream, uint32_t flags,
                                                   kdispatch_dispatch_info* info);

/** kdispatch_pretune_<op> of any op by name (see kdispatch_op_call). */
KDISPATCH_C_API kdispatch_status kdispatch_op_pretune(kdispatch_runtime* rt, const char* op,
                                                      const DLTensor* const* tensors, int32_t n_tensors,
                                                      const float* scalars, int32_t n_scalars, char** json_out);

/** The workspace, in bytes, that this call of `op` (its tensors and scalars
 *  as kdispatch_op_call takes them; data may be NULL) may ask for: the most
 *  that any variant of the tensors' backend asks for this problem, so the
 *  plan served fits whatever the table holds. A binding that allocates
 *  each call's workspace from its own allocator passes a buffer of this
 *  size to kdispatch_op_call (fused_moe: from M * top_k * I * 4 bytes to
 *  the tensor-core variants' sorted pairs and intermediates). *bytes_out:
 *  0 where no variant takes one, and for the GEMMs (their cuBLASLt and
 *  split-K plans use the stream's workspace, else fall back); INT64_MAX
 *  where int64 cannot hold it. Needs no runtime; thread-safe.
 *  Errors: INVALID_ARGUMENT (op or bytes_out NULL, an unknown op, counts,
 *  shapes or dtypes the op refuses, naming the argument). */
KDISPATCH_C_API kdispatch_status kdispatch_op_workspace_bytes(const char* op, const DLTensor* const* tensors,
                                                              int32_t n_tensors, const float* scalars,
                                                              int32_t n_scalars, int64_t* bytes_out);

/* ------------------------------------------------------------------ tuning */

/** Tunes a problem ahead of traffic on scratch buffers of the same shapes,
 *  strides and dtypes (the tensors' data are not read or written and may be
 *  NULL; a non-NULL bias without data describes a bias), persists and
 *  publishes the winner. *json_out (caller-owned):
 *  {"key", "M", "config", "variant", "best_us", "default_us", "candidates",
 *  "rejected", "failed", "persisted"}. Blocks for the search.
 *  Errors: as the op for bad tensors (data may be NULL), INVALID_ARGUMENT
 *  (json_out NULL), FAILED_PRECONDITION (frozen), OUT_OF_MEMORY (over the
 *  scratch budget), NO_VARIANT (nothing runs). */
KDISPATCH_C_API kdispatch_status kdispatch_pretune_gemm(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b,
                                                        const DLTensor* d, const DLTensor* bias, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_rmsnorm(kdispatch_runtime* rt, const DLTensor* y, const DLTensor* x,
                                                           const DLTensor* w, float eps, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_fused_add_rmsnorm(kdispatch_runtime* rt, const DLTensor* x,
                                                                     const DLTensor* residual, const DLTensor* w,
                                                                     float eps, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_silu_and_mul(kdispatch_runtime* rt, const DLTensor* out,
                                                                const DLTensor* x, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_gemm_fp8_tensor(kdispatch_runtime* rt, const DLTensor* a,
                                                                   const DLTensor* b, const DLTensor* d,
                                                                   const DLTensor* scale_a, const DLTensor* scale_b,
                                                                   const DLTensor* bias, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_gemm_fp8_rowwise(kdispatch_runtime* rt, const DLTensor* a,
                                                                    const DLTensor* b, const DLTensor* d,
                                                                    const DLTensor* scale_a, const DLTensor* scale_b,
                                                                    const DLTensor* bias, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_gemm_fp8_block(kdispatch_runtime* rt, const DLTensor* a,
                                                                  const DLTensor* b, const DLTensor* d,
                                                                  const DLTensor* scale_a, const DLTensor* scale_b,
                                                                  const DLTensor* bias, char** json_out);

KDISPATCH_C_API kdispatch_status kdispatch_pretune_quant_fp8_tensor(kdispatch_runtime* rt, const DLTensor* q,
                                                                    const DLTensor* x, const DLTensor* scale,
                                                                    char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_quant_fp8_token(kdispatch_runtime* rt, const DLTensor* q,
                                                                   const DLTensor* x, const DLTensor* scale,
                                                                   char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_quant_fp8_group(kdispatch_runtime* rt, const DLTensor* q,
                                                                   const DLTensor* x, const DLTensor* scale,
                                                                   char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_fused_moe(kdispatch_runtime* rt, const DLTensor* hidden,
                                                             const DLTensor* w1, const DLTensor* w2,
                                                             const DLTensor* topk_weights, const DLTensor* topk_ids,
                                                             const DLTensor* out, const DLTensor* w1_scale,
                                                             const DLTensor* w2_scale, float routed_scaling_factor,
                                                             float activation, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_moe_sum(kdispatch_runtime* rt, const DLTensor* input,
                                                           const DLTensor* out, float routed_scaling_factor,
                                                           char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_moe_align(kdispatch_runtime* rt, const DLTensor* topk_ids,
                                                             const DLTensor* sorted_token_ids,
                                                             const DLTensor* expert_ids,
                                                             const DLTensor* num_tokens_post_pad,
                                                             const DLTensor* expert_map, float num_experts,
                                                             float block_size, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_moe_gemm(
    kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w, const DLTensor* out, const DLTensor* topk_weights,
    const DLTensor* sorted_token_ids, const DLTensor* expert_ids, const DLTensor* num_tokens_post_pad,
    const DLTensor* w_scale, float top_k, float block_size, float mul_routed_weight, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_moe_gemm_fp8_tensor(
    kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w, const DLTensor* out, const DLTensor* topk_weights,
    const DLTensor* sorted_token_ids, const DLTensor* expert_ids, const DLTensor* num_tokens_post_pad,
    const DLTensor* w_scale, const DLTensor* a_scale, float top_k, float block_size, float mul_routed_weight,
    char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_moe_gemm_fp8_channel(
    kdispatch_runtime* rt, const DLTensor* a, const DLTensor* w, const DLTensor* out, const DLTensor* topk_weights,
    const DLTensor* sorted_token_ids, const DLTensor* expert_ids, const DLTensor* num_tokens_post_pad,
    const DLTensor* w_scale, const DLTensor* a_scale, float top_k, float block_size, float mul_routed_weight,
    char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_fused_moe_fp8_tensor(
    kdispatch_runtime* rt, const DLTensor* hidden, const DLTensor* w1, const DLTensor* w2, const DLTensor* topk_weights,
    const DLTensor* topk_ids, const DLTensor* out, const DLTensor* w1_scale, const DLTensor* w2_scale,
    const DLTensor* a1_scale, const DLTensor* a2_scale, float routed_scaling_factor, float activation, char** json_out);
KDISPATCH_C_API kdispatch_status kdispatch_pretune_fused_moe_fp8_channel(
    kdispatch_runtime* rt, const DLTensor* hidden, const DLTensor* w1, const DLTensor* w2, const DLTensor* topk_weights,
    const DLTensor* topk_ids, const DLTensor* out, const DLTensor* w1_scale, const DLTensor* w2_scale,
    const DLTensor* a1_scale, const DLTensor* a2_scale, float routed_scaling_factor, float activation, char** json_out);

/* ------------------------------------------------------------------ lookup */

/** A config query (dispatch::LookupQuery). Zero it, set struct_size =
 *  sizeof(kdispatch_lookup_query) (or use kdispatch_lookup_query_init), key
 *  and M. Strings: NULL = "". */
typedef struct kdispatch_lookup_query {
  uint32_t struct_size;
  const char* op;     /* "triton_fused_moe", "triton_gemm", "gemm", "rmsnorm", ...; NULL: inferred */
  const char* key;    /* file-name fields other than device_name: "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]" */
  const char* device; /* "NVIDIA H200" or "NVIDIA_H200"; NULL: the host CPU's ISA class */
  const char* arch;   /* optional hardware identity for the device-name resolver */
  int32_t compute_units;
  int64_t memory_bytes;
  const char* backend; /* own ops: "cpu", "cuda", "hip"; NULL: inferred from the device */
  int64_t M;           /* >= 1 (ignored by kdispatch_lookup_table) */
  int32_t down;        /* 1: the _down table (falls back to the up table, as SGLang) */
} kdispatch_lookup_query;

/** Zeroes `q`, sets struct_size and M = 1. NULL is a no-op. */
KDISPATCH_C_API void kdispatch_lookup_query_init(kdispatch_lookup_query* q);

/** Looks up a config. *json_out (caller-owned): {"config": {...},
 *  "source": file or "default", "source_dir", "match": "exact" | "nearest" |
 *  "default" | "forced", "M": table key or null, "variant": name or null,
 *  "key": canonical key, "why": text}. Nearest-M ties go to the smaller key.
 *  Errors: INVALID_ARGUMENT (rt/q/json_out NULL, bad struct_size, key NULL
 *  or malformed, M < 1, unknown op or backend, down for an op other than
 *  triton_fused_moe), NOT_FOUND (no row and no default rule for the key). */
KDISPATCH_C_API kdispatch_status kdispatch_lookup(const kdispatch_runtime* rt, const kdispatch_lookup_query* q,
                                                  char** json_out);

/** The whole table that serves a key (what SGLang's get_moe_configs returns
 *  from one file, here merged across config dirs by precedence), rows as
 *  written in the files (no defaults filled in). q->M is ignored.
 *  *json_out (caller-owned): {"key": canonical key, "rows": {"<M>": {...},
 *  ...} ascending, "sources": {"<M>": file}, "source_dirs": {"<M>": dir}}.
 *  Errors: as kdispatch_lookup, plus NOT_FOUND when no table serves the key
 *  (a lookup would answer with the default). */
KDISPATCH_C_API kdispatch_status kdispatch_lookup_table(const kdispatch_runtime* rt, const kdispatch_lookup_query* q,
                                                        char** json_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDISPATCH_C_API_H */
