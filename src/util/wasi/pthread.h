/* pthreads for a WebAssembly build without threads (wasm32-wasi: wasi-libc has no
 * pthread.h), put first on the include path by cmake/toolchain-wasm32-wasi.cmake. One
 * thread exists, so: pthread_once runs its routine on the first call; a mutex is a flag
 * (locking one that is held would be a self-deadlock, reported as EDEADLK); waiting on a
 * condition variable cannot be woken by anyone and returns EDEADLK instead of hanging;
 * pthread_create fails with EAGAIN, which the thread pool (src/kernels/cpu/pool.c) takes as
 * "run with the threads we got": every task on the calling thread. */
#ifndef NEEDLE_WASI_PTHREAD_H
#define NEEDLE_WASI_PTHREAD_H

#include <errno.h>

typedef struct { int done; } pthread_once_t;
typedef struct { int locked; } pthread_mutex_t;
typedef struct { int unused; } pthread_cond_t;
typedef int pthread_mutexattr_t;
typedef int pthread_condattr_t;
typedef int pthread_attr_t;
typedef unsigned long pthread_t;

#define PTHREAD_ONCE_INIT {0}
#define PTHREAD_MUTEX_INITIALIZER {0}
#define PTHREAD_COND_INITIALIZER {0}

static inline int pthread_once(pthread_once_t *once, void (*routine)(void)) {
    if (!once->done) {
        once->done = 1;
        routine();
    }
    return 0;
}

static inline int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
    (void)a;
    m->locked = 0;
    return 0;
}
static inline int pthread_mutex_destroy(pthread_mutex_t *m) { return m->locked ? EBUSY : 0; }
static inline int pthread_mutex_lock(pthread_mutex_t *m) {
    if (m->locked) return EDEADLK;
    m->locked = 1;
    return 0;
}
static inline int pthread_mutex_trylock(pthread_mutex_t *m) {
    if (m->locked) return EBUSY;
    m->locked = 1;
    return 0;
}
static inline int pthread_mutex_unlock(pthread_mutex_t *m) {
    if (!m->locked) return EPERM;
    m->locked = 0;
    return 0;
}

static inline int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a) {
    (void)c;
    (void)a;
    return 0;
}
static inline int pthread_cond_destroy(pthread_cond_t *c) { (void)c; return 0; }
static inline int pthread_cond_signal(pthread_cond_t *c) { (void)c; return 0; }
static inline int pthread_cond_broadcast(pthread_cond_t *c) { (void)c; return 0; }
static inline int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    (void)c;
    (void)m;
    return EDEADLK;
}

static inline int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                                 void *arg) {
    (void)t;
    (void)a;
    (void)fn;
    (void)arg;
    return EAGAIN;
}
static inline int pthread_join(pthread_t t, void **ret) {
    (void)t;
    (void)ret;
    return ESRCH;
}

#endif
