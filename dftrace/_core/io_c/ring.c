/* ring.c: the ring the wrappers record into (a compare-and-swap for the room, the
 * record's stores, a release store of its sequence number; full: the call is counted
 * as dropped), the fd table's memory, and what a forked child starts from. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wrap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

fd_entry_t *io_fd_table = NULL;
int io_fd_top = -1;
pid_t io_pid = 0;
io_ring_t io_ring = {NULL, 0};
uint64_t io_head __attribute__((aligned(64))) = 0;
uint64_t io_tail __attribute__((aligned(64))) = 0;
uint64_t io_dropped __attribute__((aligned(64))) = 0;
int io_active = 0;

int io_fd_table_init(void) {
    io_pid = (pid_t)syscall(SYS_getpid);
    if (io_fd_table)
        return 0;
    void *p = mmap(NULL, sizeof(fd_entry_t) * FD_MAX, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    io_fd_table = p;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the ring */

int io_ring_init(uint32_t nslots) {
    if (io_ring.slots)
        return 0;
    uint64_t n = 1024;
    while (n < nslots && n < (1u << 24))
        n <<= 1;
    void *p = mmap(NULL, n * sizeof(io_rec_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    io_ring.slots = p;
    io_ring.mask = n - 1;
    return 0;
}

__thread uint32_t io_tid __attribute__((tls_model("initial-exec"))) = 0;

void io_after_fork_child(void) {
    io_tid = 0;
    io_pid = (pid_t)syscall(SYS_getpid);
    /* the parent's records are the parent's: its reader takes them; this process
       starts after them (a slot a parent thread had taken and not filled is skipped) */
    __atomic_store_n(&io_tail, __atomic_load_n(&io_head, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
    io_dropped = 0;
}

void io_record_path(uint8_t op, uint64_t fhash, int64_t t0, int64_t t1, int64_t ret, int err,
                    int64_t offset, const char *path, size_t npath) {
    if (npath > IO_PATH_MAX)
        npath = IO_PATH_MAX;
    uint64_t k = 1 + (npath + sizeof(io_rec_t) - 1) / sizeof(io_rec_t);
    uint64_t h;
    if (!io_take(k, &h))
        return;
    for (uint64_t i = 1; i < k; i++) {
        size_t at = (i - 1) * sizeof(io_rec_t);
        size_t n = npath - at < sizeof(io_rec_t) ? npath - at : sizeof(io_rec_t);
        memcpy(&io_ring.slots[(h + i) & io_ring.mask], path + at, n);
    }
    io_publish(h, op, fhash, t0, t1, ret, err, -1, offset, npath);
}
