/* SPDX-License-Identifier: Apache-2.0 */
/* kdispatch_runtime_close from C (C99 + POSIX threads, linked to the shared
 * libkdispatch): a closed runtime refuses every function with
 * KDISPATCH_FAILED_PRECONDITION, close waits for calls in flight (and with
 * a timeout that passes, says how many and leaves the runtime alive), and
 * the race of issue 31: 4 threads calling while a fifth closes, 200 rounds,
 * every call either OK or FAILED_PRECONDITION, nothing else (run under the
 * asan and tsan presets too). Prints one line per failed check and exits 1
 * when any failed. */
#define _POSIX_C_SOURCE 200809L

#include <dispatch/c_api.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_failures = 0;
static int g_checks = 0;
static pthread_mutex_t g_report = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    pthread_mutex_lock(&g_report);                                                              \
    ++g_checks;                                                                                 \
    if (!(cond)) {                                                                              \
      ++g_failures;                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: '%s'\n", __FILE__, __LINE__, #cond, \
              kdispatch_last_error_message());                                                  \
    }                                                                                           \
    pthread_mutex_unlock(&g_report);                                                            \
  } while (0)

#define EXPECT(code, call)                                                                             \
  do {                                                                                                 \
    kdispatch_status s_ = (call);                                                                      \
    if (s_ != (code))                                                                                  \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__, __LINE__, #call, (int)s_, \
              kdispatch_status_name(s_), (int)(code));                                                 \
    CHECK(s_ == (code));                                                                               \
  } while (0)

#define CONTAINS(haystack, needle) CHECK((haystack) != NULL && strstr((haystack), (needle)) != NULL)

static void sleep_ms(double ms) {
  struct timespec ts;
  ts.tv_sec = (time_t)(ms / 1000.0);
  ts.tv_nsec = (long)(fmod(ms, 1000.0) * 1e6);
  nanosleep(&ts, NULL);
}

static kdispatch_runtime* make_rt(void) {
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = NULL;
  if (kdispatch_runtime_create(&o, &rt) != KDISPATCH_OK || rt == NULL) {
    fprintf(stderr, "cannot create a runtime: %s\n", kdispatch_last_error_message());
    exit(2);
  }
  return rt;
}

/* A float32 tensor view. */
typedef struct {
  DLTensor t;
  int64_t shape[2];
} tensor;
static DLTensor* f32(tensor* r, float* p, int ndim, int64_t d0, int64_t d1) {
  memset(r, 0, sizeof *r);
  r->shape[0] = d0;
  r->shape[1] = d1;
  r->t.data = p;
  r->t.device.device_type = kDLCPU;
  r->t.ndim = ndim;
  r->t.dtype.code = kDLFloat;
  r->t.dtype.bits = 32;
  r->t.dtype.lanes = 1;
  r->t.shape = r->shape;
  return &r->t;
}

#define REFUSED(call)                                                   \
  do {                                                                  \
    EXPECT(KDISPATCH_FAILED_PRECONDITION, call);                        \
    CONTAINS(kdispatch_last_error_message(), "the runtime was closed"); \
  } while (0)

/* Every function that takes the handle refuses a closed one; close again and
 * destroy are OK. */
static void test_closed_runtime_refuses_everything(void) {
  kdispatch_runtime* rt = make_rt();
  float x[4 * 16], y[4 * 16], w[16];
  for (int i = 0; i < 64; ++i) x[i] = (float)i / 64.f;
  for (int i = 0; i < 16; ++i) w[i] = 1.f;
  tensor tx, ty, tw;
  EXPECT(KDISPATCH_OK, kdispatch_rmsnorm(rt, f32(&ty, y, 2, 4, 16), f32(&tx, x, 2, 4, 16), f32(&tw, w, 1, 16, 0), 1e-6f,
                                         NULL, 0, NULL));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_close(rt, KDISPATCH_CLOSE_DEFAULT_TIMEOUT));
  CHECK(kdispatch_last_error_message()[0] == '\0');

  REFUSED(
      kdispatch_rmsnorm(rt, f32(&ty, y, 2, 4, 16), f32(&tx, x, 2, 4, 16), f32(&tw, w, 1, 16, 0), 1e-6f, NULL, 0, NULL));
  CHECK(strcmp(kdispatch_last_error_message(),
               "kdispatch_rmsnorm: the runtime was closed (kdispatch_runtime_close); no call may use it") == 0);
  const DLTensor* t3[3] = {&ty.t, &tx.t, &tw.t};
  const float eps = 1e-6f;
  REFUSED(kdispatch_op_call(rt, "rmsnorm", t3, 3, &eps, 1, NULL, 0, NULL, 0, NULL));
  char* json = NULL;
  REFUSED(kdispatch_op_pretune(rt, "rmsnorm", t3, 3, &eps, 1, &json));
  CHECK(json == NULL);
  REFUSED(kdispatch_pretune_rmsnorm(rt, &ty.t, &tx.t, &tw.t, 1e-6f, &json));
  REFUSED(kdispatch_runtime_reload(rt));
  REFUSED(kdispatch_runtime_freeze(rt, 1));
  int32_t v = 7;
  REFUSED(kdispatch_runtime_frozen(rt, &v));
  CHECK(v == 7);
  REFUSED(kdispatch_runtime_load_report(rt, &json));
  CHECK(json == NULL);
  REFUSED(kdispatch_runtime_cache_dir(rt, &json));
  REFUSED(kdispatch_runtime_device_info(rt, kDLCPU, 0, &json));
  kdispatch_tune_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  REFUSED(kdispatch_runtime_tune_stats(rt, &st));
  REFUSED(kdispatch_runtime_wait_tuner_idle(rt, 0.0, &v));
  REFUSED(kdispatch_runtime_export_misses(rt, "/tmp/kdispatch-never-written.csv"));
  char* dir = NULL;
  REFUSED(kdispatch_runtime_source_path(rt, 1, &json, &dir));
  REFUSED(kdispatch_runtime_attach_stream(rt, kDLCUDA, 0, NULL, 1024));
  kdispatch_lookup_query q;
  kdispatch_lookup_query_init(&q);
  q.key = "hidden=16,dtype=fp32";
  q.op = "rmsnorm";
  REFUSED(kdispatch_lookup(rt, &q, &json));
  REFUSED(kdispatch_lookup_table(rt, &q, &json));

  /* closing again: OK (a no-op); destroy frees the handle */
  EXPECT(KDISPATCH_OK, kdispatch_runtime_close(rt, 0.0));
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt));

  /* argument errors, and the default runtime (never closed) */
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_close(NULL, 1.0));
  CHECK(strcmp(kdispatch_last_error_message(), "kdispatch_runtime_close: rt is NULL") == 0);
  rt = make_rt();
  EXPECT(KDISPATCH_INVALID_ARGUMENT, kdispatch_runtime_close(rt, nan("")));
  CHECK(strcmp(kdispatch_last_error_message(), "kdispatch_runtime_close: timeout_s is NaN") == 0);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(rt)); /* destroy closes too */
  kdispatch_runtime* def = NULL;
  if (kdispatch_default_runtime(&def) == KDISPATCH_OK) {
    EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_runtime_close(def, 1.0));
    CHECK(strcmp(kdispatch_last_error_message(),
                 "kdispatch_runtime_close: the default runtime lives until exit and cannot be closed") == 0);
    EXPECT(KDISPATCH_OK, kdispatch_runtime_frozen(def, &v)); /* still open */
  }
}

/* ---- close with a timeout that passes while a long call is in flight */

typedef struct {
  kdispatch_runtime* rt;
  pthread_mutex_t mu;
  int started; /* under mu */
  int ok_calls, refused, other;
} long_caller;

enum { GM = 192, GN = 192, GK = 192 };
static float g_a[GM * GK], g_b[GN * GK];

static void* long_calls(void* p) {
  long_caller* c = (long_caller*)p;
  float* d = (float*)malloc(sizeof(float) * GM * GN);
  tensor ta, tb, td;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    c->started = 1;
    pthread_mutex_unlock(&c->mu);
    const kdispatch_status s = kdispatch_gemm(c->rt, f32(&ta, g_a, 2, GM, GK), f32(&tb, g_b, 2, GN, GK),
                                              f32(&td, d, 2, GM, GN), NULL, NULL, 0, NULL);
    if (s == KDISPATCH_OK) {
      ++c->ok_calls;
    } else if (s == KDISPATCH_FAILED_PRECONDITION) {
      ++c->refused;
      break;
    } else {
      ++c->other;
      break;
    }
  }
  free(d);
  return NULL;
}

static void test_close_timeout_leaves_the_runtime_alive(void) {
  for (int i = 0; i < GM * GK; ++i) g_a[i] = (float)(i % 7) * 0.25f;
  for (int i = 0; i < GN * GK; ++i) g_b[i] = (float)(i % 5) * 0.5f;
  int timed_out = 0;
  for (int attempt = 0; attempt < 5 && !timed_out; ++attempt) {
    long_caller c;
    memset(&c, 0, sizeof c);
    c.rt = make_rt();
    pthread_mutex_init(&c.mu, NULL);
    pthread_t th;
    pthread_create(&th, NULL, long_calls, &c);
    for (int started = 0; !started;) {
      sleep_ms(1);
      pthread_mutex_lock(&c.mu);
      started = c.started;
      pthread_mutex_unlock(&c.mu);
    }
    sleep_ms(5);
    const kdispatch_status s = kdispatch_runtime_close(c.rt, 0.0);
    CHECK(s == KDISPATCH_OK || s == KDISPATCH_FAILED_PRECONDITION);
    if (s == KDISPATCH_FAILED_PRECONDITION) { /* the gemm was in flight: left alive */
      timed_out = 1;
      CHECK(strcmp(kdispatch_last_error_message(),
                   "kdispatch_runtime_close: 1 call is still in flight on this runtime after 0 s; the runtime is "
                   "left alive and closed to new calls (close again to wait again)") == 0);
      EXPECT(KDISPATCH_OK, kdispatch_runtime_close(c.rt, KDISPATCH_CLOSE_DEFAULT_TIMEOUT)); /* waits for it */
    }
    pthread_join(th, NULL);
    CHECK(c.refused == 1 && c.other == 0);
    EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(c.rt));
    pthread_mutex_destroy(&c.mu);
  }
  CHECK(timed_out); /* a 192^3 gemm runs for far longer than the window between two calls */
}

/* ---- the race: 4 threads calling, a fifth closing, 200 rounds */

enum { ROUNDS = 200, CALLERS = 4 };

typedef struct {
  kdispatch_runtime* rt;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int callers_started;
} round_state;

typedef struct {
  round_state* r;
  int index;
  long ok_calls, refused, other;
  char other_message[256];
} caller;

static void* call_until_closed(void* p) {
  caller* c = (caller*)p;
  float x[2 * 32], y[2 * 32], w[32];
  for (int i = 0; i < 64; ++i) x[i] = (float)(i - 32) / 16.f;
  for (int i = 0; i < 32; ++i) w[i] = 1.f;
  tensor tx, ty, tw;
  int announced = 0;
  for (long n = 0;; ++n) {
    kdispatch_status s;
    if (c->index == 3 && n % 2 == 1) { /* one caller alternates an op with a lookup */
      kdispatch_lookup_query q;
      kdispatch_lookup_query_init(&q);
      q.op = "rmsnorm";
      q.key = "hidden=32,dtype=fp32";
      char* json = NULL;
      s = kdispatch_lookup(c->r->rt, &q, &json);
      kdispatch_free(json);
    } else {
      s = kdispatch_rmsnorm(c->r->rt, f32(&ty, y, 2, 2, 32), f32(&tx, x, 2, 2, 32), f32(&tw, w, 1, 32, 0), 1e-6f, NULL,
                            0, NULL);
    }
    if (s == KDISPATCH_OK) {
      ++c->ok_calls;
    } else if (s == KDISPATCH_FAILED_PRECONDITION &&
               strstr(kdispatch_last_error_message(), "the runtime was closed") != NULL) {
      ++c->refused;
      break;
    } else {
      ++c->other;
      snprintf(c->other_message, sizeof c->other_message, "%d %s", (int)s, kdispatch_last_error_message());
      break;
    }
    if (!announced) {
      announced = 1;
      pthread_mutex_lock(&c->r->mu);
      ++c->r->callers_started;
      pthread_cond_broadcast(&c->r->cv);
      pthread_mutex_unlock(&c->r->mu);
    }
  }
  if (!announced) { /* refused before its first call succeeded: still counted */
    pthread_mutex_lock(&c->r->mu);
    ++c->r->callers_started;
    pthread_cond_broadcast(&c->r->cv);
    pthread_mutex_unlock(&c->r->mu);
  }
  return NULL;
}

typedef struct {
  round_state* r;
  kdispatch_status status;
  char message[256];
} closer;

static void* close_when_started(void* p) {
  closer* c = (closer*)p;
  pthread_mutex_lock(&c->r->mu);
  while (c->r->callers_started < CALLERS) pthread_cond_wait(&c->r->cv, &c->r->mu);
  pthread_mutex_unlock(&c->r->mu);
  c->status = kdispatch_runtime_close(c->r->rt, KDISPATCH_CLOSE_DEFAULT_TIMEOUT);
  snprintf(c->message, sizeof c->message, "%s", kdispatch_last_error_message());
  return NULL;
}

static void test_close_while_four_threads_call(void) {
  long ok_calls = 0, refused = 0, other = 0, close_failed = 0;
  for (int round = 0; round < ROUNDS; ++round) {
    round_state r;
    r.rt = make_rt();
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    r.callers_started = 0;
    caller c[CALLERS];
    pthread_t th[CALLERS + 1];
    for (int i = 0; i < CALLERS; ++i) {
      memset(&c[i], 0, sizeof c[i]);
      c[i].r = &r;
      c[i].index = i;
      pthread_create(&th[i], NULL, call_until_closed, &c[i]);
    }
    closer cl;
    memset(&cl, 0, sizeof cl);
    cl.r = &r;
    pthread_create(&th[CALLERS], NULL, close_when_started, &cl);
    for (int i = 0; i <= CALLERS; ++i) pthread_join(th[i], NULL);
    if (cl.status != KDISPATCH_OK) {
      ++close_failed;
      fprintf(stderr, "round %d: close returned %d: %s\n", round, (int)cl.status, cl.message);
    }
    for (int i = 0; i < CALLERS; ++i) {
      ok_calls += c[i].ok_calls;
      refused += c[i].refused;
      other += c[i].other;
      if (c[i].other) fprintf(stderr, "round %d, caller %d: unexpected status %s\n", round, i, c[i].other_message);
    }
    /* a late call through the closed handle: refused, not a use-after-free */
    float x[32], w[32];
    memset(x, 0, sizeof x);
    for (int i = 0; i < 32; ++i) w[i] = 1.f;
    tensor tx, tw;
    EXPECT(KDISPATCH_FAILED_PRECONDITION, kdispatch_rmsnorm(r.rt, f32(&tx, x, 2, 1, 32), f32(&tx, x, 2, 1, 32),
                                                            f32(&tw, w, 1, 32, 0), 1e-6f, NULL, 0, NULL));
    EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(r.rt));
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
  }
  printf("close race: %d rounds, %ld calls OK, %ld refused (failed_precondition), %ld other, %ld closes failed\n",
         ROUNDS, ok_calls, refused, other, close_failed);
  CHECK(other == 0);
  CHECK(close_failed == 0);
  CHECK(refused == (long)ROUNDS * CALLERS);  /* every caller ends on the refusal */
  CHECK(ok_calls >= (long)ROUNDS * CALLERS); /* each caller's first call came before close started */
}

/* ---- fork(): the child's copy of the in-flight record must not hold the
 * parent's other threads' calls (they do not exist in the child). */

typedef struct {
  kdispatch_runtime* rt;
  volatile int stop;
  long calls;
  pthread_mutex_t mu;
} loop_state;

static void* call_in_a_loop(void* arg) {
  loop_state* st = (loop_state*)arg;
  float x[64], y[64], w[64];
  for (int i = 0; i < 64; ++i) x[i] = (float)i, w[i] = 1.f;
  tensor tx, ty, tw;
  for (;;) {
    pthread_mutex_lock(&st->mu);
    const int stop = st->stop;
    pthread_mutex_unlock(&st->mu);
    if (stop) break;
    if (kdispatch_rmsnorm(st->rt, f32(&ty, y, 2, 2, 32), f32(&tx, x, 2, 2, 32), f32(&tw, w, 1, 32, 0), 1e-6f, NULL, 0,
                          NULL) != KDISPATCH_OK)
      break;
    pthread_mutex_lock(&st->mu);
    ++st->calls;
    pthread_mutex_unlock(&st->mu);
  }
  return NULL;
}

static long calls_of(loop_state* st) {
  pthread_mutex_lock(&st->mu);
  const long n = st->calls;
  pthread_mutex_unlock(&st->mu);
  return n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GCC 12's ASan and TSan runtimes can deadlock a child forked while other
 * threads allocate (see CMakePresets.json's asan filter): skipped there. */
static int under_sanitizer(void) { return getenv("ASAN_OPTIONS") != NULL || getenv("TSAN_OPTIONS") != NULL; }

static void test_close_in_a_fork_child_while_the_parent_calls(void) {
  if (under_sanitizer()) {
    printf("fork child close: skipped under a sanitizer\n");
    return;
  }
  loop_state st;
  memset(&st, 0, sizeof st);
  pthread_mutex_init(&st.mu, NULL);
  st.rt = make_rt();
  pthread_t th[2];
  for (int i = 0; i < 2; ++i) pthread_create(&th[i], NULL, call_in_a_loop, &st);
  while (calls_of(&st) < 100) sleep_ms(1);
  int slow = 0, failed = 0;
  for (int k = 0; k < 10; ++k) {
    const pid_t pid = fork();
    if (pid == 0) {
      const double t0 = now_s();
      const kdispatch_status s = kdispatch_runtime_close(st.rt, 2.0);
      const double dt = now_s() - t0;
      if (s != KDISPATCH_OK) {
        fprintf(stderr, "fork child: close returned %d: %s\n", (int)s, kdispatch_last_error_message());
        _exit(1);
      }
      _exit(dt < 1.0 ? 0 : 2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 1)
      ++failed;
    else if (WEXITSTATUS(status) == 2)
      ++slow;
  }
  pthread_mutex_lock(&st.mu);
  st.stop = 1;
  pthread_mutex_unlock(&st.mu);
  for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
  EXPECT(KDISPATCH_OK, kdispatch_runtime_destroy(st.rt));
  printf("fork child close: 10 children, %d failed, %d slow\n", failed, slow);
  CHECK(failed == 0);
  CHECK(slow == 0);
}

/* kdispatch_park_calls_at_exit: another thread's call blocks when it ends,
 * the calling thread's calls go on. In a child process (the parked thread
 * stays parked until that process exits). */
static void test_park_calls_at_exit(void) {
  const pid_t pid = fork();
  if (pid == 0) {
    loop_state st;
    memset(&st, 0, sizeof st);
    pthread_mutex_init(&st.mu, NULL);
    st.rt = make_rt();
    pthread_t th;
    pthread_create(&th, NULL, call_in_a_loop, &st);
    while (calls_of(&st) < 10) sleep_ms(1);
    kdispatch_park_calls_at_exit();
    sleep_ms(50);
    const long c1 = calls_of(&st);
    sleep_ms(150);
    const long c2 = calls_of(&st);
    float x[32], w[32];
    memset(x, 0, sizeof x);
    for (int i = 0; i < 32; ++i) w[i] = 1.f;
    tensor tx, tw;
    const kdispatch_status own = kdispatch_rmsnorm(st.rt, f32(&tx, x, 2, 1, 32), f32(&tx, x, 2, 1, 32),
                                                   f32(&tw, w, 1, 32, 0), 1e-6f, NULL, 0, NULL);
    if (c2 != c1 || own != KDISPATCH_OK) {
      fprintf(stderr, "park: the other thread's calls went %ld -> %ld after 150 ms; own call %d\n", c1, c2, (int)own);
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  printf("park at exit: the other thread parked, the exiting thread's call OK (child exit %d)\n",
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* The cache dir of a run by hand (ctest sets its own), removed when the
   process that made it exits (make_rt's exit(2) too). */
static char g_cache[] = "/tmp/kdispatch-c-api-close-XXXXXX";
static pid_t g_cache_owner; /* a fork child's exit(2) leaves the parent's dir alone */
static void remove_cache(void) {
  if (getpid() != g_cache_owner) return;
  char cmd[100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_cache);
}

int main(void) {
  /* never the user's tuning cache */
  const char* cache = getenv("KDISPATCH_CACHE_DIR");
  if (cache == NULL || *cache == '\0') {
    if (mkdtemp(g_cache) == NULL) {
      perror("mkdtemp");
      return 2;
    }
    setenv("KDISPATCH_CACHE_DIR", g_cache, 1);
    g_cache_owner = getpid();
    atexit(remove_cache);
  }
  test_closed_runtime_refuses_everything();
  test_close_in_a_fork_child_while_the_parent_calls();
  test_park_calls_at_exit();
  test_close_timeout_leaves_the_runtime_alive();
  test_close_while_four_threads_call();
  printf("test_c_api_close: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
