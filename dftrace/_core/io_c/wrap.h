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

/* Record one call (ring.c): into the ring, or counted as dropped when it is full. */
void io_record(uint8_t op, uint64_t fhash, int64_t t0, int64_t t1, int64_t ret, int err,
               int64_t count, int64_t offset, const char *path, size_t npath);

/* The hash of `path` (relative to `dirfd`) when it is traced, its absolute form left
   in `out` (IO_PATH_MAX bytes) and its length in `*nout`; else 0 (filter.c). */
uint64_t io_match(int dirfd, const char *path, char *out, size_t *nout);

#endif
