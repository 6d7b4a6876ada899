/* io.h: the one internal header of dftrace._core._io, the file-I/O interposer.
 *
 * interpose.c  the wrappers of the libc calls (open ... fread), the fd table, the
 *              path filter and the lock-free ring they record into; nothing in it
 *              allocates, locks or touches Python, so that a wrapper may run in a
 *              signal handler, a vfork child or a child forked from C
 * got.c        binding: the wrappers written into the GOT of every loaded object
 *              (and of each one dlopen() loads later), the old entries kept to undo it
 * counters.c   each file's counters, a bounded table (counters.h)
 * text.c       the lines of JSON made here (FH and io_file records)
 * module.c     the Python module: install(), uninstall(), drain() (the ring read,
 *              per-file counters kept, calls over the rate cap folded into per-file
 *              aggregates), counter_lines()
 */
#ifndef DFTRACE_IO_H
#define DFTRACE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "../engine_c/io_sink.h"

/* One call as the wrappers record it: 64 bytes, one ring slot (io_sink.h: the
   engine reads it too). */
typedef dft_io_call_t io_rec_t;

/* The calls, by their folded name (open64, __open_2 ... are OP_OPEN). The order is
   that of IO_OP_NAMES (module.c hands it to Python). */
enum {
    OP_OPEN, OP_OPENAT, OP_CREAT, OP_CLOSE, OP_READ, OP_PREAD, OP_READV, OP_PREADV,
    OP_WRITE, OP_PWRITE, OP_WRITEV, OP_PWRITEV, OP_LSEEK, OP_FSYNC, OP_FDATASYNC,
    OP_FTRUNCATE, OP_STAT, OP_LSTAT, OP_FSTAT, OP_FSTATAT, OP_MMAP, OP_DUP, OP_DUP2,
    OP_DUP3, OP_FCNTL, OP_UNLINK, OP_UNLINKAT, OP_RENAME, OP_RENAMEAT, OP_MKDIR,
    OP_MKDIRAT, OP_RMDIR, OP_OPENDIR, OP_CLOSEDIR, OP_TRUNCATE, OP_SENDFILE_READ,
    OP_SENDFILE_WRITE, OP_COPY_RANGE_READ, OP_COPY_RANGE_WRITE,
    OP_FOPEN, OP_FDOPEN, OP_FCLOSE, OP_FREAD, OP_FWRITE, OP_FSEEK, OP_FTELL, OP_FGETS,
    OP_FPUTS,
    OP_COUNT
};
#define OP_FIRST_STDIO OP_FOPEN

extern const char *const io_op_names[OP_COUNT];

/* interpose.c */
#define IO_MAX_PREFIXES 64
#define IO_PATH_MAX 4096

typedef struct {
    io_rec_t *slots;
    uint64_t mask; /* slots - 1 (a power of two) */
} io_ring_t;

extern io_ring_t io_ring;
extern uint64_t io_head, io_tail, io_dropped; /* io_tail: the reader's (module.c) */
extern int io_active;                         /* wrappers record (else they only call) */

typedef struct {
    const char *name;
    void *wrapper;
    void **real; /* the function the wrapper calls, found at install */
} io_hook_t;
extern io_hook_t io_hooks[];
extern const size_t io_nhooks;

/* Set the filter (before binding): prefixes traced (none: all), prefixes, name
   endings and whole paths never traced. 0, or -1 when a list is too long. */
int io_set_filter(const char *const *traced, int ntraced, const char *const *excluded,
                  int nexcluded, const char *const *endings, int nendings,
                  const char *const *paths, int npaths);
int io_ring_init(uint32_t nslots);
int io_fd_table_init(void);
void io_after_fork_child(void);
uint64_t io_path_hash(const char *p, size_t n);

/* text.c: a growing buffer of text; each function returns 0, or -1 when memory ran
   out. */
typedef struct {
    char *p;
    size_t n, cap;
} text_t;
int text_put(text_t *t, const char *s, size_t n);
int text_int(text_t *t, long long v);
int text_json(text_t *t, const char *s, size_t n); /* as a JSON string, never altered */
int text_hash(text_t *t, uint64_t h);              /* as a JSON string of 16 hex digits */

/* got.c */
int io_bind(void);   /* write the wrappers into every object's GOT; the count bound */
void io_unbind(void); /* put the old entries back */
void io_skip_object(const char *path); /* never bind this file (the engine) */
void io_got_after_fork_child(void);    /* the binding's lock, afresh */

#endif
