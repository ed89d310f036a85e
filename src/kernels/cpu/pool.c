/* The CPU thread pool and the batched CQ product over it (see cpu.h).
 *
 * A run is published by storing a new `generation` under the mutex; workers that are
 * polling see it at once, workers that went to sleep are woken by the broadcast. The low
 * bit of the generation tells the mode:
 *   - all-threads runs (cpu_pool_run): every worker calls fn, and the caller waits for
 *     the `pending` countdown;
 *   - joinable runs (cpu_pool_run_shared, for work-sharing loops such as cpu_matmul's
 *     row chunks): a worker calls fn only if the run is still `open` when it arrives.
 *     The caller closes the run once its own fn returns (all work taken) and waits only
 *     for workers that joined (`active`). A worker that lost its core (busy or
 *     oversubscribed machine) thus never delays the caller: it finds the run closed.
 *     The join is a Dekker handshake on sequentially consistent atomics: a worker
 *     increments `active` then reads `open`; the caller clears `open`, issues a full
 *     fence, then reads `active`, so at least one of them sees the other.
 * The mutex, the sequentially consistent generation store and the release/acquire on
 * the countdowns make the caller's writes (fn, arg, inputs) visible to workers and the
 * workers' outputs visible to the caller when the run returns.
 *
 * Waiting is staged: a tight spin for SPIN_US (a decode step issues the next run within
 * microseconds), then polling with sched_yield() until YIELD_US (so that on a busy
 * machine a waiting thread hands its core to one that has work), then sleeping on the
 * condition variable. An idle worker's polling span is per pool (cpu_pool_set_idle_wait:
 * training, with serial stretches between runs, polls briefly). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "needle.h"
#include "util/clock.h"
#include "util/platform.h"

#define MAX_THREADS 256
#define SPIN_US 30      /* tight spinning before yielding */
#define YIELD_US 2000   /* polling with sched_yield before sleeping */
#define CHUNK_WORK 32768u  /* target multiply-adds per row chunk handed to a thread */

struct cpu_pool;

typedef struct pool_worker {
    struct cpu_pool *pool;
    int index;
    pthread_t thread;
} pool_worker;

struct cpu_pool {
    int n;                         /* threads, the caller included */
    const cpu_kernels *k;
    pool_worker *workers;          /* [n - 1] */
    int started;                   /* workers successfully created */
    cq_scratch *scratch;           /* [n] */
    float *scratch_mem;
    uint64_t runs;                 /* caller only */
    uint64_t sync_ns;              /* caller only: hand-off cost, see cpu_pool_sync_stats */

    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation; /* 2 * run number + 1 if joinable */
    atomic_uint_fast64_t open;       /* generation of the joinable run still open, or 0 */
    atomic_int active;             /* workers inside a joinable run */
    atomic_int pending;            /* workers still running an all-threads run */
    atomic_int_fast64_t yield_us;  /* polling before sleeping (cpu_pool_set_idle_wait) */
    int sleepers;                  /* under mu */
    int stop;                      /* under mu */
    atomic_int stop_flag;

    void (*fn)(void *arg, int i, int n);
    void *arg;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls until *value differs from `old` (or `stop` is set) for at most `limit_us`:
 * tight spinning first, then yielding. Returns the last value read. */
static uint_fast64_t wait_change(atomic_uint_fast64_t *value, uint_fast64_t old,
                                 atomic_int *stop, int64_t limit_us) {
    uint_fast64_t v = atomic_load(value);
    int64_t start = -1;
    for (unsigned i = 0; v == old; i++) {
        if (atomic_load_explicit(stop, memory_order_relaxed)) break;
        if (i % 64 == 63) {
            const int64_t t = (util_clock_ns() / 1000);
            if (start < 0) start = t;
            if (t - start > limit_us) break;
            if (t - start > SPIN_US) sched_yield();
        }
        cpu_relax();
        v = atomic_load(value);
    }
    return v;
}

/* Polls until *count is 0: tight spinning, then yielding (a worker lost its core). */
static void wait_zero(atomic_int *count) {
    int64_t start = -1;
    for (unsigned i = 0; atomic_load_explicit(count, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if (i % 64 == 63) {
            const int64_t t = (util_clock_ns() / 1000);
            if (start < 0) start = t;
            if (t - start > SPIN_US) sched_yield();
        }
    }
}

static void *worker_main(void *p) {
    pool_worker *self = p;
    struct cpu_pool *pool = self->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t gen = wait_change(&pool->generation, seen, &pool->stop_flag,
                                        atomic_load_explicit(&pool->yield_us, memory_order_relaxed));
        if (gen == seen) {
            pthread_mutex_lock(&pool->mu);
            while ((gen = atomic_load(&pool->generation)) == seen && !pool->stop) {
                pool->sleepers++;
                pthread_cond_wait(&pool->wake, &pool->mu);
                pool->sleepers--;
            }
            const int stop = pool->stop;
            pthread_mutex_unlock(&pool->mu);
            if (stop && gen == seen) return NULL;
        }
        seen = gen;
        if (gen & 1) {
            atomic_fetch_add(&pool->active, 1);
            if (atomic_load(&pool->open) == gen) pool->fn(pool->arg, self->index, pool->n);
            atomic_fetch_sub_explicit(&pool->active, 1, memory_order_release);
        } else {
            pool->fn(pool->arg, self->index, pool->n);
            atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
        }
    }
}

static int default_threads(void) {
    const char *env = getenv("NEEDLE_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (!*end && v > 0) return v > MAX_THREADS ? MAX_THREADS : (int)v;
    }
    const int cores = platform_cpu_count();
    return cores > MAX_THREADS ? MAX_THREADS : cores;
}

void cpu_pool_free(cpu_pool *pool) {
    if (!pool) return;
    if (pool->started) {
        pthread_mutex_lock(&pool->mu);
        pool->stop = 1;
        atomic_store(&pool->stop_flag, 1);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 0; i < pool->started; i++) pthread_join(pool->workers[i].thread, NULL);
    }
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool->scratch);
    platform_aligned_free(pool->scratch_mem);
    free(pool);
}

int cpu_pool_create(int n_threads, const cpu_kernels *kernels, size_t scratch_floats,
                    cpu_pool **out) {
    *out = NULL;
    int n = n_threads > 0 ? n_threads : default_threads();
    if (n > MAX_THREADS) n = MAX_THREADS;
    cpu_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NEEDLE_ERR_OUT_OF_MEMORY;
    pool->n = n;
    pool->k = kernels ? kernels : cpu_kernels_best();
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->open, 0);
    atomic_init(&pool->active, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->stop_flag, 0);
    atomic_init(&pool->yield_us, YIELD_US);
    /* each thread's scratch starts on its own 64-byte line */
    const size_t per = (scratch_floats + 15) / 16 * 16;
    pool->scratch = calloc((size_t)n, sizeof *pool->scratch);
    pool->workers = calloc((size_t)n, sizeof *pool->workers);
    if (per && !(per > SIZE_MAX / sizeof(float) / (size_t)n - 16))
        pool->scratch_mem = platform_aligned_alloc(64, ((size_t)n * per + 16) * sizeof(float));
    if (!pool->scratch || !pool->workers || (per && !pool->scratch_mem)) {
        cpu_pool_free(pool);
        return NEEDLE_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        pool->scratch[i].buf = per ? pool->scratch_mem + (size_t)i * per : NULL;
        pool->scratch[i].cap = per;
    }
    for (int i = 1; i < n; i++) {
        pool_worker *w = &pool->workers[i - 1];
        w->pool = pool;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pool->n = i; /* run with the threads we got (at least the caller) */
            break;
        }
        pool->started++;
    }
    *out = pool;
    return NEEDLE_OK;
}

int cpu_pool_threads(const cpu_pool *pool) { return pool ? pool->n : 1; }

void cpu_pool_set_idle_wait(cpu_pool *pool, int64_t us) {
    if (pool) atomic_store_explicit(&pool->yield_us, us > SPIN_US ? us : SPIN_US, memory_order_relaxed);
}

const cpu_kernels *cpu_pool_kernels(const cpu_pool *pool) {
    return pool ? pool->k : cpu_kernels_best();
}

/* noinline: once GCC 12 splits and partly inlines this function (as it does with the
 * hand-off timing), its ThreadSanitizer build rejects the fence below (-Wtsan, an error
 * under NEEDLE_WERROR); one call per dispatch costs nothing measurable. */
__attribute__((noinline)) static void run(cpu_pool *pool, void (*fn)(void *arg, int i, int n),
                                          void *arg, int joinable) {
    if (pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    const int64_t t_enter = util_clock_ns();
    pool->fn = fn;
    pool->arg = arg;
    const uint_fast64_t gen = (uint_fast64_t)(++pool->runs) << 1 | (joinable ? 1 : 0);
    if (joinable) atomic_store(&pool->open, gen);
    else atomic_store(&pool->pending, pool->n - 1);
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->generation, gen);
    if (pool->sleepers) pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    const int64_t t_publish = util_clock_ns();
    fn(arg, 0, pool->n);
    const int64_t t_own = util_clock_ns();
    if (joinable) {
        atomic_store(&pool->open, 0);
        /* the Dekker handshake needs this store ordered before the loads of `active`,
         * which are only acquire loads: an acquire load may be satisfied early (ARMv8.3
         * LDAPR; qemu-user on x86 hosts, where a stale read let a late worker run fn
         * after this call had returned) */
        atomic_thread_fence(memory_order_seq_cst);
        wait_zero(&pool->active);
    } else {
        wait_zero(&pool->pending);
    }
    pool->sync_ns += (uint64_t)((t_publish - t_enter) + (util_clock_ns() - t_own));
}

void cpu_pool_sync_stats(const cpu_pool *pool, uint64_t *runs, uint64_t *sync_ns) {
    *runs = pool && pool->n > 1 ? pool->runs : 0;
    *sync_ns = pool ? pool->sync_ns : 0;
}

void cpu_pool_run(cpu_pool *pool, void (*fn)(void *arg, int i, int n), void *arg) {
    run(pool, fn, arg, 0);
}

void cpu_pool_run_shared(cpu_pool *pool, void (*fn)(void *arg, int i, int n), void *arg) {
    run(pool, fn, arg, 1);
}

/* ---- batched CQ products ----------------------------------------------------------- */

#define MAX_JOBS 16

typedef struct matmul_batch {
    cpu_pool *pool;
    const float *xr;
    size_t ld_x;
    uint32_t ntok, njobs;
    const cq_job *jobs;
    uint32_t chunk_rows[MAX_JOBS];
    uint32_t first_chunk[MAX_JOBS + 1]; /* prefix sums of chunks per job */
    atomic_uint next;
} matmul_batch;

static void matmul_worker(void *arg, int i, int n) {
    (void)n;
    matmul_batch *b = arg;
    cq_scratch *sc = &b->pool->scratch[i];
    sc->valid = 0; /* the activations are new for this batch */
    const cpu_kernels *k = b->pool->k;
    const uint32_t total = b->first_chunk[b->njobs];
    uint32_t j = 0;
    for (;;) {
        const uint32_t c = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
        if (c >= total) break;
        while (c >= b->first_chunk[j + 1]) j++;
        const cq_job *job = &b->jobs[j];
        const uint32_t r = (c - b->first_chunk[j]) * b->chunk_rows[j];
        const uint32_t nr = job->nrows - r < b->chunk_rows[j] ? job->nrows - r : b->chunk_rows[j];
        k->matmul(job->w, job->row0 + r, nr, b->xr, b->ld_x, b->ntok, job->y + r, job->ld_y,
                  sc);
    }
}

void cpu_matmul(cpu_pool *pool, const float *xr, size_t ld_x, uint32_t ntok,
                const cq_job *jobs, uint32_t njobs) {
    for (uint32_t j0 = 0; j0 < njobs; j0 += MAX_JOBS) {
        matmul_batch b;
        b.pool = pool;
        b.xr = xr;
        b.ld_x = ld_x;
        b.ntok = ntok;
        b.jobs = jobs + j0;
        b.njobs = njobs - j0 < MAX_JOBS ? njobs - j0 : MAX_JOBS;
        b.first_chunk[0] = 0;
        for (uint32_t j = 0; j < b.njobs; j++) {
            const uint64_t row_work = (uint64_t)b.jobs[j].w->cols_pad * (ntok ? ntok : 1);
            uint64_t rows = CHUNK_WORK / (row_work ? row_work : 1);
            /* many tokens: whole tiles of the level's products (AVX2 3 rows, AVX-512 4,
             * AMX 16); one token: whole 16-row blocks of the AVX-512 2-bit products */
            const uint64_t step = ntok > 1 ? (pool->k->tile_rows ? pool->k->tile_rows : 12) : 16;
            rows = rows < step ? step : (rows + step - 1) / step * step;
            if (rows > b.jobs[j].nrows) rows = b.jobs[j].nrows ? b.jobs[j].nrows : 1;
            b.chunk_rows[j] = (uint32_t)rows;
            b.first_chunk[j + 1] =
                b.first_chunk[j] + (b.jobs[j].nrows + b.chunk_rows[j] - 1) / b.chunk_rows[j];
        }
        atomic_init(&b.next, 0);
        if (pool->n == 1 || b.first_chunk[b.njobs] == 1)
            matmul_worker(&b, 0, 1);
        else
            cpu_pool_run_shared(pool, matmul_worker, &b);
    }
}
