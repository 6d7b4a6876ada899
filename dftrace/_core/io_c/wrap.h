/* wrap.h: what the wrappers (interpose.c) share with the ring and the fd table
 * (ring.c) and the path filter (filter.c): the fd table's look-ups, the clock, the
 * record of a call. Nothing here allocates, locks or touches Python. */
#ifndef DFTRACE_IO_WRAP_H
#define DFTRACE_IO_WRAP_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io.h"

#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* The fd table: one entry per fd number, no aliasing: 2^20 entries (the kernel's
   default most fds a process may have, fs.nr_open), mapped untouched, so that only
   the pages of fds in use take memory. An fd beyond it is not traced. */
#define FD_MAX (1u << 20)
typedef struct {
    uint64_t fhash; /* 0: not traced */
    int64_t pos;    /* the offset the next read or write is at, as far as seen */
} fd_entry_t;
extern fd_entry_t *io_fd_table;
extern int io_fd_top; /* the highest fd ever traced: the end of a close_range's sweep */
/* The process's pid, to tell a vfork child (which shares this memory) from it. */
extern pid_t io_pid;

/* The `pos` of an fd in append mode (O_APPEND): each write goes to the file's end,
   which is not known here, whatever a seek said. */
#define POS_APPEND INT64_MIN

/* The offset a read or write on `e` starts at: -1 when not known (append mode). */
static inline int64_t fd_offset(fd_entry_t *e) {
    int64_t p = __atomic_load_n(&e->pos, __ATOMIC_RELAXED);
    return p == POS_APPEND ? -1 : p;
}

static inline int fd_appends(fd_entry_t *e) {
    return __atomic_load_n(&e->pos, __ATOMIC_RELAXED) == POS_APPEND;
}

static inline fd_entry_t *fd_traced(int fd) {
    if ((unsigned)fd >= FD_MAX || !io_fd_table)
        return NULL;
    fd_entry_t *e = &io_fd_table[fd];
    return __atomic_load_n(&e->fhash, __ATOMIC_RELAXED) ? e : NULL;
}

static inline void fd_track(int fd, uint64_t fhash, int64_t pos) {
    if ((unsigned)fd >= FD_MAX || !io_fd_table)
        return;
    __atomic_store_n(&io_fd_table[fd].pos, pos, __ATOMIC_RELAXED);
    __atomic_store_n(&io_fd_table[fd].fhash, fhash, __ATOMIC_RELAXED);
    int top = __atomic_load_n(&io_fd_top, __ATOMIC_RELAXED);
    while (fhash && fd > top &&
           !__atomic_compare_exchange_n(&io_fd_top, &top, fd, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* An fd a call returned that is not traced: whatever entry its number had (an fd
   closed where no wrapper saw it: a direct system call) is gone. */
static inline void fd_untrack(int fd) {
    if ((unsigned)fd < FD_MAX && io_fd_table &&
        __atomic_load_n(&io_fd_table[fd].fhash, __ATOMIC_RELAXED))
        __atomic_store_n(&io_fd_table[fd].fhash, 0, __ATOMIC_RELAXED);
}

/* True in a vfork child: it shares the table and the ring with its parent, and must
   change neither. Asked only where a call would change the table. */
static inline int in_vfork_child(void) {
    return io_pid && (pid_t)syscall(SYS_getpid) != io_pid;
}

static inline int64_t clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* -- the record of a call (the ring's side: ring.c) -- */

/* The calling thread's id, read once per thread (0: not yet; a forked child's first
   thread starts again). */
extern __thread uint32_t io_tid __attribute__((tls_model("initial-exec")));

static inline uint32_t io_thread_id(void) {
    uint32_t t = io_tid;
    if (__builtin_expect(t == 0, 0))
        io_tid = t = (uint32_t)syscall(SYS_gettid);
    return t;
}

/* Take `k` slots of the ring (a compare-and-swap for the room): 1 and the first
   one's number in *h, or 0 when the ring is full (the call counted as dropped). */
static inline int io_take(uint64_t k, uint64_t *h) {
    uint64_t cap = io_ring.mask + 1;
    uint64_t at = __atomic_load_n(&io_head, __ATOMIC_RELAXED);
    do {
        if (at + k - __atomic_load_n(&io_tail, __ATOMIC_ACQUIRE) > cap) {
            __atomic_add_fetch(&io_dropped, 1, __ATOMIC_RELAXED);
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&io_head, &at, at + k, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    *h = at;
    return 1;
}

/* Fill the record of slot `h` (its path's `npath` bytes already in the slots after
   it) and publish it: its sequence number, stored last, is h + 1. */
static inline void io_publish(uint64_t h, uint8_t op, uint64_t fhash, int64_t t0, int64_t t1,
                              int64_t ret, int err, int64_t count, int64_t offset, size_t npath) {
    io_rec_t *r = &io_ring.slots[h & io_ring.mask];
    r->t0 = t0;
    r->dur = t1 - t0;
    r->fhash = fhash;
    if (op == OP_FOPEN || op == OP_FDOPEN || op == OP_OPENDIR)
        ret = ret ? 0 : -1; /* the stream, or NULL */
    r->ret = ret;
    r->count = count;
    r->offset = offset;
    r->tid = io_thread_id();
    r->op = op;
    r->err = ret < 0 ? (uint8_t)(err > 255 ? 255 : err) : 0;
    r->npath = (uint16_t)npath;
    __atomic_store_n(&r->seq, h + 1, __ATOMIC_RELEASE);
}

/* Record a call that names no path: one slot, inline in the wrapper. */
static inline void io_record_fd(uint8_t op, uint64_t fhash, int64_t t0, int64_t t1, int64_t ret,
                                int err, int64_t count, int64_t offset) {
    uint64_t h;
    if (io_take(1, &h))
        io_publish(h, op, fhash, t0, t1, ret, err, count, offset, 0);
}

/* Record a call that names a path (ring.c): the record (`offset`: -1 where the call has
   none) and the path's bytes in the slots after it. */
void io_record_path(uint8_t op, uint64_t fhash, int64_t t0, int64_t t1, int64_t ret, int err,
                    int64_t offset, const char *path, size_t npath);

/* The hash of `path` (relative to `dirfd`) when it is traced, its absolute form left
   in `out` (IO_PATH_MAX bytes) and its length in `*nout`; else 0 (filter.c). */
uint64_t io_match(int dirfd, const char *path, char *out, size_t *nout);

#endif
