/* interpose.c: the wrappers of libc's file calls, and the table got.c binds.
 *
 * A wrapper on an fd looks the fd up in the table (one load); an fd no traced open
 * put there costs that look-up and the call. A traced call takes two clock readings
 * and records one 64-byte record (io_record_fd, wrap.h): no allocation, no lock, no
 * Python, errno exactly as libc left it. A call that names a path is matched once,
 * at that call (io_match, filter.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wrap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* the wrappers */

#define REAL(name) real_##name
#define DECLARE(ret, name, ...) static ret (*real_##name)(__VA_ARGS__) = NULL

/* The traced part of a call on an fd, its entry e_. */
#define FD_TRACED(op, call, count, offset, update)                                     \
    do {                                                                               \
        int64_t t0_ = clock_ns();                                                      \
        __typeof__(call) r_ = call;                                                    \
        int err_ = errno;                                                              \
        int64_t t1_ = clock_ns();                                                      \
        int64_t off_ = (offset);                                                       \
        update;                                                                        \
        io_record_fd(op, e_->fhash, t0_, t1_, (int64_t)r_, err_, count, off_);         \
        errno = err_;                                                                  \
        return r_;                                                                     \
    } while (0)

/* A call on an fd: untraced fds cost the lookup. */
#define FD_CALL(op, fd, call, count, offset, update)                                   \
    do {                                                                               \
        fd_entry_t *e_ = io_active ? fd_traced(fd) : NULL;                             \
        if (!e_)                                                                       \
            return call;                                                               \
        FD_TRACED(op, call, count, offset, update);                                    \
    } while (0)

/* A hot call on an fd in two: the untraced case (a table look-up and a tail call of
   libc's function, with no register saved) and, not inlined, the traced one, handed
   the fd's entry (e_); the definition after it is the traced one's body. */
#define WITH_ENTRY(...) (fd_entry_t *e_, __VA_ARGS__)
#define ENTRY_AND(...) (e, __VA_ARGS__)
#define SPLIT(rtype, name, PARAMS, ARGS, fdexpr)                                       \
    static rtype t_##name WITH_ENTRY PARAMS;                                           \
    static rtype w_##name PARAMS {                                                     \
        fd_entry_t *e = io_active ? fd_traced(fdexpr) : NULL;                          \
        if (__builtin_expect(!e, 1))                                                   \
            return REAL(name) ARGS;                                                    \
        return t_##name ENTRY_AND ARGS;                                                \
    }                                                                                  \
    static __attribute__((noinline)) rtype t_##name WITH_ENTRY PARAMS

/* The position an fd's read or write starts at, and the move after it. */
#define POS (fd_offset(e_))
#define ADVANCE                                                                      \
    do {                                                                             \
        if ((int64_t)r_ > 0 && off_ >= 0)                                            \
            __atomic_store_n(&e_->pos, off_ + (int64_t)r_, __ATOMIC_RELAXED);        \
    } while (0)

/* A call that names a path: matched at the call, recorded (with `offset`, or -1) where
   `kept` holds of its result (r_). `untraced` runs on the result of a call on a path
   not traced. */
#define PATH_CALL_IF(op, dirfd, path, call, offset, kept, after, untraced)             \
    do {                                                                             \
        if (!io_active)                                                              \
            return call;                                                             \
        char abs_[IO_PATH_MAX];                                                      \
        size_t n_ = 0;                                                               \
        int saved_ = errno;                                                          \
        uint64_t h_ = io_match(dirfd, path, abs_, &n_);                                 \
        errno = saved_;                                                              \
        if (!h_) {                                                                   \
            __typeof__(call) r_ = call;                                              \
            untraced;                                                                \
            return r_;                                                               \
        }                                                                            \
        int64_t t0_ = clock_ns();                                                    \
        __typeof__(call) r_ = call;                                                  \
        int err_ = errno;                                                            \
        int64_t t1_ = clock_ns();                                                    \
        after;                                                                       \
        if (kept)                                                                    \
            io_record_path(op, h_, t0_, t1_, (int64_t)r_, err_, offset, abs_, n_);      \
        errno = err_;                                                                \
        return r_;                                                                   \
    } while (0)
#define PATH_CALL_OR(op, dirfd, path, call, after, untraced)                           \
    PATH_CALL_IF(op, dirfd, path, call, -1, 1, after, untraced)
#define PATH_CALL(op, dirfd, path, call, after) PATH_CALL_OR(op, dirfd, path, call, after, (void)0)
/* An open: the fd of an untraced path has no entry */
#define OPEN_CALL(op, dirfd, path, call, after)                                        \
    PATH_CALL_OR(op, dirfd, path, call, after, if (r_ >= 0) fd_untrack(r_))

static inline int64_t iov_bytes(const struct iovec *iov, int n) {
    int64_t s = 0;
    for (int i = 0; i < n && iov; i++)
        s += (int64_t)iov[i].iov_len;
    return s;
}

static inline int open_has_mode(int flags) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

/* -- open family: the fd takes the path's hash, at offset 0, or in append mode
   (O_APPEND: its writes' offsets unknown) -- */
#define OPEN_AFTER(flags)                                                              \
    do {                                                                             \
        if (r_ >= 0)                                                                 \
            fd_track(r_, h_, ((flags) & O_APPEND) ? POS_APPEND : 0);                   \
    } while (0)

/* `mode`: the variadic mode argument of an open call whose flags say it has one, else
   0 (a macro: va_start runs in the wrapper itself). */
#define OPEN_MODE(mode, flags)                                                         \
    mode_t mode = 0;                                                                   \
    if (open_has_mode(flags)) {                                                        \
        va_list ap;                                                                    \
        va_start(ap, flags);                                                           \
        mode = (mode_t)va_arg(ap, int);                                                \
        va_end(ap);                                                                    \
    }

#define OPEN_WRAPPER(name, op)                                                         \
    DECLARE(int, name, const char *, int, ...);                                        \
    static int w_##name(const char *path, int flags, ...) {                            \
        OPEN_MODE(mode, flags);                                                        \
        OPEN_CALL(op, AT_FDCWD, path, REAL(name)(path, flags, mode), OPEN_AFTER(flags)); \
    }
OPEN_WRAPPER(open, OP_OPEN)
OPEN_WRAPPER(open64, OP_OPEN)

#define OPENAT_WRAPPER(name)                                                           \
    DECLARE(int, name, int, const char *, int, ...);                                   \
    static int w_##name(int dirfd, const char *path, int flags, ...) {                 \
        OPEN_MODE(mode, flags);                                                        \
        OPEN_CALL(OP_OPENAT, dirfd, path, REAL(name)(dirfd, path, flags, mode),        \
                  OPEN_AFTER(flags));                                                  \
    }
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

#define OPEN2_WRAPPER(name)                                                            \
    DECLARE(int, name, const char *, int);                                             \
    static int w_##name(const char *path, int flags) {                                 \
        OPEN_CALL(OP_OPEN, AT_FDCWD, path, REAL(name)(path, flags), OPEN_AFTER(flags)); \
    }
OPEN2_WRAPPER(__open_2)
OPEN2_WRAPPER(__open64_2)

#define OPENAT2_WRAPPER(name)                                                          \
    DECLARE(int, name, int, const char *, int);                                        \
    static int w_##name(int dirfd, const char *path, int flags) {                      \
        OPEN_CALL(OP_OPENAT, dirfd, path, REAL(name)(dirfd, path, flags), OPEN_AFTER(flags)); \
    }
OPENAT2_WRAPPER(__openat_2)
OPENAT2_WRAPPER(__openat64_2)

#define CREAT_WRAPPER(name)                                                            \
    DECLARE(int, name, const char *, mode_t);                                          \
    static int w_##name(const char *path, mode_t mode) {                               \
        OPEN_CALL(OP_CREAT, AT_FDCWD, path, REAL(name)(path, mode), OPEN_AFTER(0));    \
    }
CREAT_WRAPPER(creat)
CREAT_WRAPPER(creat64)

/* -- close (and fclose): the entry is cleared before the fd is, so that an fd number
   another thread gets from the kernel meanwhile keeps its own entry -- */
#define CLOSE_CALL(op, fd, call)                                                       \
    do {                                                                             \
        fd_entry_t *e_ = io_active ? fd_traced(fd) : NULL;                           \
        if (!e_ || in_vfork_child())                                                 \
            return call;                                                             \
        uint64_t h_ = e_->fhash;                                                     \
        __atomic_store_n(&e_->fhash, 0, __ATOMIC_RELAXED);                           \
        int64_t t0_ = clock_ns();                                                    \
        int r_ = call;                                                               \
        int err_ = errno;                                                            \
        io_record_fd(op, h_, t0_, clock_ns(), r_, err_, -1, -1);                     \
        errno = err_;                                                                \
        return r_;                                                                   \
    } while (0)

DECLARE(int, close, int);
static int w_close(int fd) { CLOSE_CALL(OP_CLOSE, fd, REAL(close)(fd)); }

/* close_range and closefrom: the entries in the range go first (none past io_fd_top) */
static void untrack_range(unsigned lo, unsigned hi) {
    int top = __atomic_load_n(&io_fd_top, __ATOMIC_RELAXED);
    if (top < 0 || !io_fd_table || in_vfork_child())
        return;
    for (unsigned fd = lo; fd <= hi && fd <= (unsigned)top; fd++)
        if (__atomic_load_n(&io_fd_table[fd].fhash, __ATOMIC_RELAXED))
            __atomic_store_n(&io_fd_table[fd].fhash, 0, __ATOMIC_RELAXED);
}
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
DECLARE(int, close_range, unsigned, unsigned, int);
static int w_close_range(unsigned lo, unsigned hi, int flags) {
    if (io_active && !(flags & CLOSE_RANGE_CLOEXEC))
        untrack_range(lo, hi);
    return REAL(close_range)(lo, hi, flags);
}
DECLARE(void, closefrom, int);
static void w_closefrom(int lo) {
    if (io_active && lo >= 0)
        untrack_range((unsigned)lo, ~0u);
    REAL(closefrom)(lo);
}

/* -- reads and writes -- */
DECLARE(ssize_t, read, int, void *, size_t);
SPLIT(ssize_t, read, (int fd, void *buf, size_t n), (fd, buf, n), fd) {
    FD_TRACED(OP_READ, REAL(read)(fd, buf, n), (int64_t)n, POS, ADVANCE);
}
DECLARE(ssize_t, __read_chk, int, void *, size_t, size_t);
SPLIT(ssize_t, __read_chk, (int fd, void *buf, size_t n, size_t buflen), (fd, buf, n, buflen), fd) {
    FD_TRACED(OP_READ, REAL(__read_chk)(fd, buf, n, buflen), (int64_t)n, POS, ADVANCE);
}
DECLARE(ssize_t, write, int, const void *, size_t);
SPLIT(ssize_t, write, (int fd, const void *buf, size_t n), (fd, buf, n), fd) {
    FD_TRACED(OP_WRITE, REAL(write)(fd, buf, n), (int64_t)n, POS, ADVANCE);
}

/* A write at an offset on an fd in append mode goes to the file's end (Linux). */
#define AT(op, off)                                                                    \
    (((op) == OP_PWRITE || (op) == OP_PWRITEV) && fd_appends(e_) ? -1 : (int64_t)(off))
#define PRW_WRAPPER(name, op, cv)                                                      \
    DECLARE(ssize_t, name, int, cv void *, size_t, off_t);                             \
    SPLIT(ssize_t, name, (int fd, cv void *buf, size_t n, off_t off), (fd, buf, n, off), fd) { \
        FD_TRACED(op, REAL(name)(fd, buf, n, off), (int64_t)n, AT(op, off), (void)0);    \
    }
PRW_WRAPPER(pread, OP_PREAD, )
PRW_WRAPPER(pread64, OP_PREAD, )
PRW_WRAPPER(pwrite, OP_PWRITE, const)
PRW_WRAPPER(pwrite64, OP_PWRITE, const)

#define PREAD_CHK_WRAPPER(name)                                                        \
    DECLARE(ssize_t, name, int, void *, size_t, off_t, size_t);                        \
    SPLIT(ssize_t, name, (int fd, void *buf, size_t n, off_t off, size_t buflen),      \
          (fd, buf, n, off, buflen), fd) {                                             \
        FD_TRACED(OP_PREAD, REAL(name)(fd, buf, n, off, buflen), (int64_t)n,           \
                (int64_t)off, (void)0);                                                \
    }
PREAD_CHK_WRAPPER(__pread_chk)
PREAD_CHK_WRAPPER(__pread64_chk)

#define RWV_WRAPPER(name, op)                                                          \
    DECLARE(ssize_t, name, int, const struct iovec *, int);                            \
    SPLIT(ssize_t, name, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt), fd) { \
        FD_TRACED(op, REAL(name)(fd, iov, cnt), iov_bytes(iov, cnt), POS, ADVANCE);    \
    }
RWV_WRAPPER(readv, OP_READV)
RWV_WRAPPER(writev, OP_WRITEV)

#define PRWV_WRAPPER(name, op)                                                         \
    DECLARE(ssize_t, name, int, const struct iovec *, int, off_t);                     \
    SPLIT(ssize_t, name, (int fd, const struct iovec *iov, int cnt, off_t off),        \
          (fd, iov, cnt, off), fd) {                                                   \
        FD_TRACED(op, REAL(name)(fd, iov, cnt, off), iov_bytes(iov, cnt), AT(op, off),    \
                (void)0);                                                              \
    }
PRWV_WRAPPER(preadv, OP_PREADV)
PRWV_WRAPPER(preadv64, OP_PREADV)
PRWV_WRAPPER(pwritev, OP_PWRITEV)
PRWV_WRAPPER(pwritev64, OP_PWRITEV)

#ifdef RWF_APPEND
#define RWF_APPEND_ RWF_APPEND
#else
#define RWF_APPEND_ 0x10 /* the kernel's, since 4.16 */
#endif
#define PRWV2_WRAPPER(name, op)                                                        \
    DECLARE(ssize_t, name, int, const struct iovec *, int, off_t, int);                \
    static ssize_t w_##name(int fd, const struct iovec *iov, int cnt, off_t off, int fl) { \
        FD_CALL(op, fd, REAL(name)(fd, iov, cnt, off, fl), iov_bytes(iov, cnt),        \
                off == -1 ? POS : (fl & RWF_APPEND_) ? -1 : AT(op, off),               \
                if (off == -1) ADVANCE);                                               \
    }
PRWV2_WRAPPER(preadv2, OP_PREADV)
PRWV2_WRAPPER(preadv64v2, OP_PREADV)
PRWV2_WRAPPER(pwritev2, OP_PWRITEV)
PRWV2_WRAPPER(pwritev64v2, OP_PWRITEV)

/* -- copies made by the kernel: sendfile and copy_file_range move bytes from one fd
   to another with no read or write call. Each traced side is a record of its own
   with the call's times: the input's as a read (*_read), the output's as a write
   (*_write). A side with an offset pointer is at *offset (its fd's position stays);
   one without is at its fd's position, which moves by the bytes copied. -- */
static inline void copy_side(uint8_t op, fd_entry_t *e, int moves, int64_t off, int64_t t0,
                             int64_t t1, int64_t r, int err, int64_t count) {
    if (moves && r > 0 && off >= 0)
        __atomic_store_n(&e->pos, off + r, __ATOMIC_RELAXED);
    io_record_fd(op, e->fhash, t0, t1, r, err, count, off);
}
#define COPY_CALL(rop, wop, in_fd, in_at, out_fd, out_at, call, count)                 \
    do {                                                                             \
        fd_entry_t *ei_ = io_active ? fd_traced(in_fd) : NULL;                       \
        fd_entry_t *eo_ = io_active ? fd_traced(out_fd) : NULL;                      \
        if (!ei_ && !eo_)                                                            \
            return call;                                                             \
        int64_t ioff_ = !ei_ ? -1 : (in_at) ? (int64_t)*(in_at) : fd_offset(ei_);      \
        int64_t ooff_ = !eo_ ? -1 : (out_at) ? (int64_t)*(out_at) : fd_offset(eo_);    \
        int64_t t0_ = clock_ns();                                                    \
        ssize_t r_ = call;                                                           \
        int err_ = errno;                                                            \
        int64_t t1_ = clock_ns();                                                    \
        if (ei_)                                                                     \
            copy_side(rop, ei_, !(in_at), ioff_, t0_, t1_, r_, err_, (int64_t)(count)); \
        if (eo_)                                                                     \
            copy_side(wop, eo_, !(out_at), ooff_, t0_, t1_, r_, err_, (int64_t)(count)); \
        errno = err_;                                                                \
        return r_;                                                                   \
    } while (0)

#define SENDFILE_WRAPPER(name, off_type)                                               \
    DECLARE(ssize_t, name, int, int, off_type *, size_t);                              \
    static ssize_t w_##name(int out_fd, int in_fd, off_type *offset, size_t count) {   \
        COPY_CALL(OP_SENDFILE_READ, OP_SENDFILE_WRITE, in_fd, offset, out_fd,          \
                  (off_type *)NULL, REAL(name)(out_fd, in_fd, offset, count), count);  \
    }
SENDFILE_WRAPPER(sendfile, off_t)
SENDFILE_WRAPPER(sendfile64, off64_t)

DECLARE(ssize_t, copy_file_range, int, loff_t *, int, loff_t *, size_t, unsigned int);
static ssize_t w_copy_file_range(int in_fd, loff_t *in_at, int out_fd, loff_t *out_at,
                                 size_t len, unsigned int flags) {
    COPY_CALL(OP_COPY_RANGE_READ, OP_COPY_RANGE_WRITE, in_fd, in_at, out_fd, out_at,
              REAL(copy_file_range)(in_fd, in_at, out_fd, out_at, len, flags), len);
}

/* -- on an fd: seek, sync, truncate, fstat, mmap, fcntl -- */
#define LSEEK_WRAPPER(name)                                                            \
    DECLARE(off_t, name, int, off_t, int);                                             \
    SPLIT(off_t, name, (int fd, off_t off, int whence), (fd, off, whence), fd) {       \
        FD_TRACED(OP_LSEEK, REAL(name)(fd, off, whence), -1, (int64_t)off,             \
                if ((int64_t)r_ >= 0 && !fd_appends(e_))                               \
                    __atomic_store_n(&e_->pos, (int64_t)r_, __ATOMIC_RELAXED));        \
    }
LSEEK_WRAPPER(lseek)
LSEEK_WRAPPER(lseek64)

#define FD1_WRAPPER(name, op)                                                          \
    DECLARE(int, name, int);                                                           \
    static int w_##name(int fd) { FD_CALL(op, fd, REAL(name)(fd), -1, -1, (void)0); }
FD1_WRAPPER(fsync, OP_FSYNC)
FD1_WRAPPER(fdatasync, OP_FDATASYNC)

#define FTRUNC_WRAPPER(name)                                                           \
    DECLARE(int, name, int, off_t);                                                    \
    static int w_##name(int fd, off_t len) {                                           \
        FD_CALL(OP_FTRUNCATE, fd, REAL(name)(fd, len), -1, (int64_t)len, (void)0);     \
    }
FTRUNC_WRAPPER(ftruncate)
FTRUNC_WRAPPER(ftruncate64)

#define FSTAT_WRAPPER(name, st)                                                        \
    DECLARE(int, name, int, struct st *);                                              \
    static int w_##name(int fd, struct st *buf) {                                      \
        FD_CALL(OP_FSTAT, fd, REAL(name)(fd, buf), -1, -1, (void)0);                   \
    }
FSTAT_WRAPPER(fstat, stat)
FSTAT_WRAPPER(fstat64, stat64)

#define FXSTAT_WRAPPER(name, st)                                                       \
    DECLARE(int, name, int, int, struct st *);                                         \
    static int w_##name(int ver, int fd, struct st *buf) {                             \
        FD_CALL(OP_FSTAT, fd, REAL(name)(ver, fd, buf), -1, -1, (void)0);              \
    }
FXSTAT_WRAPPER(__fxstat, stat)
FXSTAT_WRAPPER(__fxstat64, stat64)

#define MMAP_WRAPPER(name)                                                             \
    DECLARE(void *, name, void *, size_t, int, int, int, off_t);                       \
    static void *w_##name(void *addr, size_t len, int prot, int flags, int fd, off_t off) { \
        if (fd < 0)                                                                    \
            return REAL(name)(addr, len, prot, flags, fd, off);                        \
        fd_entry_t *e_ = io_active ? fd_traced(fd) : NULL;                             \
        if (!e_)                                                                       \
            return REAL(name)(addr, len, prot, flags, fd, off);                        \
        int64_t t0 = clock_ns();                                                       \
        void *r = REAL(name)(addr, len, prot, flags, fd, off);                         \
        int err = errno;                                                               \
        io_record_fd(OP_MMAP, e_->fhash, t0, clock_ns(), r == MAP_FAILED ? -1 : 0, err,   \
               (int64_t)len, (int64_t)off);                                            \
        errno = err;                                                                   \
        return r;                                                                      \
    }
MMAP_WRAPPER(mmap)
MMAP_WRAPPER(mmap64)

/* -- dup: the new fd takes the old one's entry; a copy of an untraced fd has none
   (whatever its number had: an fd closed where no wrapper saw it) -- */
#define DUP_AFTER(newfd)                                                               \
    do {                                                                             \
        if ((int)r_ >= 0 && !in_vfork_child())                                       \
            fd_track((int)(newfd), e_->fhash,                                          \
                     __atomic_load_n(&e_->pos, __ATOMIC_RELAXED));                     \
    } while (0)
/* A call on an fd that makes another: as FD_CALL, the new fd (`made`, once r_ is
   known) left without an entry when the fd it copies is untraced. */
#define FD_MAKING_CALL(op, fd, call, made, after)                                      \
    do {                                                                             \
        fd_entry_t *e_ = io_active ? fd_traced(fd) : NULL;                             \
        if (!e_) {                                                                     \
            __typeof__(call) r_ = call;                                                \
            if (io_active && (int)r_ >= 0 && !in_vfork_child())                        \
                fd_untrack(made);                                                      \
            return r_;                                                                 \
        }                                                                              \
        FD_TRACED(op, call, -1, -1, after);                                            \
    } while (0)
DECLARE(int, dup, int);
static int w_dup(int fd) { FD_MAKING_CALL(OP_DUP, fd, REAL(dup)(fd), r_, DUP_AFTER(r_)); }

/* dup2/dup3 onto a traced fd closes it: its entry goes first (as in close) */
static inline void untrack_target(int fd) {
    fd_entry_t *t = fd_traced(fd);
    if (t && !in_vfork_child())
        __atomic_store_n(&t->fhash, 0, __ATOMIC_RELAXED);
}
DECLARE(int, dup2, int, int);
static int w_dup2(int fd, int fd2) {
    if (io_active && fd != fd2)
        untrack_target(fd2);
    FD_CALL(OP_DUP2, fd, REAL(dup2)(fd, fd2), -1, -1, if (fd != fd2) DUP_AFTER(fd2));
}
DECLARE(int, dup3, int, int, int);
static int w_dup3(int fd, int fd2, int flags) {
    if (io_active)
        untrack_target(fd2);
    FD_CALL(OP_DUP3, fd, REAL(dup3)(fd, fd2, flags), -1, -1, DUP_AFTER(fd2));
}

/* F_SETFL: append mode on or off (off: the position is not known, until a seek) */
#define SETFL_AFTER(cmd, arg)                                                          \
    do {                                                                             \
        if ((cmd) == F_SETFL && (int)r_ >= 0 && !in_vfork_child()                    \
            && (((long)(arg) & O_APPEND) != 0) != fd_appends(e_))                    \
            __atomic_store_n(&e_->pos, ((long)(arg) & O_APPEND) ? POS_APPEND : -1,     \
                             __ATOMIC_RELAXED);                                      \
    } while (0)
#define FCNTL_WRAPPER(name)                                                            \
    DECLARE(int, name, int, int, ...);                                                 \
    static int w_##name(int fd, int cmd, ...) {                                        \
        va_list ap;                                                                    \
        va_start(ap, cmd);                                                             \
        void *arg = va_arg(ap, void *);                                                \
        va_end(ap);                                                                    \
        if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)                                  \
            FD_MAKING_CALL(OP_FCNTL, fd, REAL(name)(fd, cmd, arg), r_, DUP_AFTER(r_)); \
        FD_CALL(OP_FCNTL, fd, REAL(name)(fd, cmd, arg), -1, -1, SETFL_AFTER(cmd, arg)); \
    }
FCNTL_WRAPPER(fcntl)
FCNTL_WRAPPER(fcntl64)

/* -- calls on a path -- */
#define STAT_WRAPPER(name, op, st)                                                     \
    DECLARE(int, name, const char *, struct st *);                                     \
    static int w_##name(const char *path, struct st *buf) {                            \
        PATH_CALL(op, AT_FDCWD, path, REAL(name)(path, buf), (void)0);                 \
    }
STAT_WRAPPER(stat, OP_STAT, stat)
STAT_WRAPPER(stat64, OP_STAT, stat64)
STAT_WRAPPER(lstat, OP_LSTAT, stat)
STAT_WRAPPER(lstat64, OP_LSTAT, stat64)

#define XSTAT_WRAPPER(name, op, st)                                                    \
    DECLARE(int, name, int, const char *, struct st *);                                \
    static int w_##name(int ver, const char *path, struct st *buf) {                   \
        PATH_CALL(op, AT_FDCWD, path, REAL(name)(ver, path, buf), (void)0);            \
    }
XSTAT_WRAPPER(__xstat, OP_STAT, stat)
XSTAT_WRAPPER(__xstat64, OP_STAT, stat64)
XSTAT_WRAPPER(__lxstat, OP_LSTAT, stat)
XSTAT_WRAPPER(__lxstat64, OP_LSTAT, stat64)

/* fstatat on an fd (AT_EMPTY_PATH and "") is fstat; else a path call */
#define FSTATAT_WRAPPER(name, st)                                                      \
    DECLARE(int, name, int, const char *, struct st *, int);                           \
    static int w_##name(int dirfd, const char *path, struct st *buf, int flags) {      \
        if ((flags & AT_EMPTY_PATH) && path && !path[0])                               \
            FD_CALL(OP_FSTAT, dirfd, REAL(name)(dirfd, path, buf, flags), -1, -1, (void)0); \
        PATH_CALL(OP_FSTATAT, dirfd, path, REAL(name)(dirfd, path, buf, flags), (void)0); \
    }
FSTATAT_WRAPPER(fstatat, stat)
FSTATAT_WRAPPER(fstatat64, stat64)

#define PATH1_WRAPPER(name, op)                                                        \
    DECLARE(int, name, const char *);                                                  \
    static int w_##name(const char *path) {                                            \
        PATH_CALL(op, AT_FDCWD, path, REAL(name)(path), (void)0);                      \
    }
PATH1_WRAPPER(unlink, OP_UNLINK)
PATH1_WRAPPER(rmdir, OP_RMDIR)

DECLARE(int, unlinkat, int, const char *, int);
static int w_unlinkat(int dirfd, const char *path, int flags) {
    PATH_CALL(OP_UNLINKAT, dirfd, path, REAL(unlinkat)(dirfd, path, flags), (void)0);
}
DECLARE(int, mkdir, const char *, mode_t);
static int w_mkdir(const char *path, mode_t mode) {
    PATH_CALL(OP_MKDIR, AT_FDCWD, path, REAL(mkdir)(path, mode), (void)0);
}
DECLARE(int, mkdirat, int, const char *, mode_t);
static int w_mkdirat(int dirfd, const char *path, mode_t mode) {
    PATH_CALL(OP_MKDIRAT, dirfd, path, REAL(mkdirat)(dirfd, path, mode), (void)0);
}
/* rename: the file is the source's */
DECLARE(int, rename, const char *, const char *);
static int w_rename(const char *from, const char *to) {
    PATH_CALL(OP_RENAME, AT_FDCWD, from, REAL(rename)(from, to), (void)0);
}
DECLARE(int, renameat, int, const char *, int, const char *);
static int w_renameat(int fromfd, const char *from, int tofd, const char *to) {
    PATH_CALL(OP_RENAMEAT, fromfd, from, REAL(renameat)(fromfd, from, tofd, to), (void)0);
}

/* -- directories: opendir's fd (opened inside libc) takes the path's entry, and
   closedir closes it, as it does the copy os.listdir(fd) and os.scandir(fd) list
   (fcntl(F_DUPFD_CLOEXEC), then fdopendir): an fd closed where no wrapper saw it
   would keep its entry, and the next pipe or socket given its number would be read
   as the directory -- */
/* (An opendir that fails is not recorded: no such directory is a library's probe of
   where it might find files, torch's on every entry of sys.path, not a listing.) */
DECLARE(DIR *, opendir, const char *);
static DIR *w_opendir(const char *path) {
    PATH_CALL_IF(OP_OPENDIR, AT_FDCWD, path, REAL(opendir)(path), -1, r_ != NULL,
                 if (r_) fd_track(dirfd(r_), h_, 0), if (r_) fd_untrack(dirfd(r_)));
}
DECLARE(int, closedir, DIR *);
static int w_closedir(DIR *d) { CLOSE_CALL(OP_CLOSEDIR, d ? dirfd(d) : -1, REAL(closedir)(d)); }

/* -- fds that are never files (pipes, sockets): made without an entry, whatever
   their number had (table stores alone: errno stays libc's) -- */
#define MAKES_FDS(call, fds, n)                                                        \
    do {                                                                             \
        int r_ = call;                                                               \
        if (r_ >= 0 && io_active && !in_vfork_child())                               \
            for (int i_ = 0; i_ < (n); i_++)                                         \
                fd_untrack((fds)[i_]);                                               \
        return r_;                                                                   \
    } while (0)
#define MAKES_FD(call) MAKES_FDS(call, &r_, 1) /* the fd it returns */
DECLARE(int, pipe, int *);
static int w_pipe(int fds[2]) { MAKES_FDS(REAL(pipe)(fds), fds, 2); }
DECLARE(int, pipe2, int *, int);
static int w_pipe2(int fds[2], int flags) { MAKES_FDS(REAL(pipe2)(fds, flags), fds, 2); }
DECLARE(int, socketpair, int, int, int, int *);
static int w_socketpair(int domain, int type, int proto, int fds[2]) {
    MAKES_FDS(REAL(socketpair)(domain, type, proto, fds), fds, 2);
}
DECLARE(int, socket, int, int, int);
static int w_socket(int domain, int type, int proto) {
    MAKES_FD(REAL(socket)(domain, type, proto));
}
DECLARE(int, accept, int, struct sockaddr *, socklen_t *);
static int w_accept(int fd, struct sockaddr *a, socklen_t *n) { MAKES_FD(REAL(accept)(fd, a, n)); }
DECLARE(int, accept4, int, struct sockaddr *, socklen_t *, int);
static int w_accept4(int fd, struct sockaddr *a, socklen_t *n, int fl) {
    MAKES_FD(REAL(accept4)(fd, a, n, fl));
}

/* truncate: the length it sets as the offset, as ftruncate's */
#define TRUNCATE_WRAPPER(name)                                                         \
    DECLARE(int, name, const char *, off_t);                                           \
    static int w_##name(const char *path, off_t len) {                                 \
        PATH_CALL_IF(OP_TRUNCATE, AT_FDCWD, path, REAL(name)(path, len), (int64_t)len, 1, \
                     (void)0, (void)0);                                                \
    }
TRUNCATE_WRAPPER(truncate)
TRUNCATE_WRAPPER(truncate64)

/* -- STDIO: a stream is its fd's entry -- */
static inline int stream_fd(FILE *fp) { return fp ? fileno_unlocked(fp) : -1; }

/* A stream opened for appending ("a", "a+") is in append mode. */
#define FOPEN_POS(mode) ((mode) && strchr((mode), 'a') ? POS_APPEND : 0)
#define FOPEN_WRAPPER(name)                                                            \
    DECLARE(FILE *, name, const char *, const char *);                                 \
    static FILE *w_##name(const char *path, const char *mode) {                        \
        PATH_CALL_OR(OP_FOPEN, AT_FDCWD, path, REAL(name)(path, mode),                 \
                     if (r_) fd_track(stream_fd(r_), h_, FOPEN_POS(mode)),                 \
                     if (r_) fd_untrack(stream_fd(r_)));                                 \
    }
FOPEN_WRAPPER(fopen)
FOPEN_WRAPPER(fopen64)

DECLARE(FILE *, fdopen, int, const char *);
static FILE *w_fdopen(int fd, const char *mode) {
    FD_CALL(OP_FDOPEN, fd, REAL(fdopen)(fd, mode), -1, -1, (void)0);
}

DECLARE(int, fclose, FILE *);
static int w_fclose(FILE *fp) { CLOSE_CALL(OP_FCLOSE, stream_fd(fp), REAL(fclose)(fp)); }

/* fread/fwrite: ret is bytes (items times size), count the bytes asked */
#define FRW_WRAPPER(name, op, cv)                                                      \
    DECLARE(size_t, name, cv void *, size_t, size_t, FILE *);                          \
    static size_t w_##name(cv void *p, size_t size, size_t n, FILE *fp) {              \
        fd_entry_t *e_ = io_active ? fd_traced(stream_fd(fp)) : NULL;                  \
        if (!e_)                                                                       \
            return REAL(name)(p, size, n, fp);                                         \
        int64_t t0 = clock_ns();                                                       \
        size_t r = REAL(name)(p, size, n, fp);                                         \
        int err = errno;                                                               \
        io_record_fd(op, e_->fhash, t0, clock_ns(), (int64_t)(r * size), err,             \
               (int64_t)(size * n), -1);                                               \
        errno = err;                                                                   \
        return r;                                                                      \
    }
FRW_WRAPPER(fread, OP_FREAD, )
FRW_WRAPPER(fread_unlocked, OP_FREAD, )
FRW_WRAPPER(fwrite, OP_FWRITE, const)
FRW_WRAPPER(fwrite_unlocked, OP_FWRITE, const)

DECLARE(size_t, __fread_chk, void *, size_t, size_t, size_t, FILE *);
static size_t w___fread_chk(void *p, size_t plen, size_t size, size_t n, FILE *fp) {
    fd_entry_t *e_ = io_active ? fd_traced(stream_fd(fp)) : NULL;
    if (!e_)
        return REAL(__fread_chk)(p, plen, size, n, fp);
    int64_t t0 = clock_ns();
    size_t r = REAL(__fread_chk)(p, plen, size, n, fp);
    int err = errno;
    io_record_fd(OP_FREAD, e_->fhash, t0, clock_ns(), (int64_t)(r * size), err, (int64_t)(size * n),
           -1);
    errno = err;
    return r;
}

#define FSEEK_WRAPPER(name, offt)                                                      \
    DECLARE(int, name, FILE *, offt, int);                                             \
    static int w_##name(FILE *fp, offt off, int whence) {                              \
        FD_CALL(OP_FSEEK, stream_fd(fp), REAL(name)(fp, off, whence), -1, (int64_t)off, \
                (void)0);                                                              \
    }
FSEEK_WRAPPER(fseek, long)
FSEEK_WRAPPER(fseeko, off_t)
FSEEK_WRAPPER(fseeko64, off_t)

#define FTELL_WRAPPER(name, offt)                                                      \
    DECLARE(offt, name, FILE *);                                                       \
    static offt w_##name(FILE *fp) {                                                   \
        FD_CALL(OP_FTELL, stream_fd(fp), REAL(name)(fp), -1, -1, (void)0);             \
    }
FTELL_WRAPPER(ftell, long)
FTELL_WRAPPER(ftello, off_t)
FTELL_WRAPPER(ftello64, off_t)

DECLARE(char *, fgets, char *, int, FILE *);
static char *w_fgets(char *s, int n, FILE *fp) {
    fd_entry_t *e_ = io_active ? fd_traced(stream_fd(fp)) : NULL;
    if (!e_)
        return REAL(fgets)(s, n, fp);
    int64_t t0 = clock_ns();
    char *r = REAL(fgets)(s, n, fp);
    int err = errno;
    int64_t t1 = clock_ns();
    io_record_fd(OP_FGETS, e_->fhash, t0, t1, r ? (int64_t)strnlen(r, (size_t)(n > 0 ? n : 0)) : -1,
           err, n, -1);
    errno = err;
    return r;
}
DECLARE(int, fputs, const char *, FILE *);
static int w_fputs(const char *s, FILE *fp) {
    fd_entry_t *e_ = io_active ? fd_traced(stream_fd(fp)) : NULL;
    if (!e_)
        return REAL(fputs)(s, fp);
    int64_t n = s ? (int64_t)strlen(s) : 0;
    int64_t t0 = clock_ns();
    int r = REAL(fputs)(s, fp);
    int err = errno;
    io_record_fd(OP_FPUTS, e_->fhash, t0, clock_ns(), r >= 0 ? n : -1, err, n, -1);
    errno = err;
    return r;
}

/* ------------------------------------------------------------------------- */
/* the table got.c binds */

#define HOOK(name) {#name, (void *)w_##name, (void **)&real_##name}
io_hook_t io_hooks[] = {
    HOOK(open), HOOK(open64), HOOK(openat), HOOK(openat64), HOOK(__open_2), HOOK(__open64_2),
    HOOK(__openat_2), HOOK(__openat64_2), HOOK(creat), HOOK(creat64), HOOK(close),
    HOOK(close_range), HOOK(closefrom),
    HOOK(read), HOOK(__read_chk), HOOK(write), HOOK(pread), HOOK(pread64), HOOK(pwrite),
    HOOK(pwrite64), HOOK(__pread_chk), HOOK(__pread64_chk), HOOK(readv), HOOK(writev),
    HOOK(preadv), HOOK(preadv64), HOOK(pwritev), HOOK(pwritev64), HOOK(preadv2),
    HOOK(preadv64v2), HOOK(pwritev2), HOOK(pwritev64v2), HOOK(sendfile), HOOK(sendfile64),
    HOOK(copy_file_range), HOOK(lseek), HOOK(lseek64),
    HOOK(fsync), HOOK(fdatasync), HOOK(ftruncate), HOOK(ftruncate64), HOOK(fstat),
    HOOK(fstat64), HOOK(__fxstat), HOOK(__fxstat64), HOOK(mmap), HOOK(mmap64), HOOK(dup),
    HOOK(dup2), HOOK(dup3), HOOK(fcntl), HOOK(fcntl64), HOOK(stat), HOOK(stat64), HOOK(lstat),
    HOOK(lstat64), HOOK(__xstat), HOOK(__xstat64), HOOK(__lxstat), HOOK(__lxstat64),
    HOOK(fstatat), HOOK(fstatat64), HOOK(unlink), HOOK(rmdir), HOOK(unlinkat), HOOK(mkdir),
    HOOK(mkdirat), HOOK(rename), HOOK(renameat), HOOK(opendir), HOOK(closedir),
    HOOK(truncate), HOOK(truncate64), HOOK(pipe), HOOK(pipe2), HOOK(socketpair), HOOK(socket),
    HOOK(accept), HOOK(accept4), HOOK(fopen), HOOK(fopen64), HOOK(fdopen),
    HOOK(fclose), HOOK(fread), HOOK(fread_unlocked), HOOK(fwrite), HOOK(fwrite_unlocked),
    HOOK(__fread_chk), HOOK(fseek), HOOK(fseeko), HOOK(fseeko64), HOOK(ftell), HOOK(ftello),
    HOOK(ftello64), HOOK(fgets), HOOK(fputs),
};
const size_t io_nhooks = sizeof(io_hooks) / sizeof(io_hooks[0]);

const char *const io_op_names[OP_COUNT] = {
    "open", "openat", "creat", "close", "read", "pread", "readv", "preadv",
    "write", "pwrite", "writev", "pwritev", "lseek", "fsync", "fdatasync",
    "ftruncate", "stat", "lstat", "fstat", "fstatat", "mmap", "dup", "dup2",
    "dup3", "fcntl", "unlink", "unlinkat", "rename", "renameat", "mkdir",
    "mkdirat", "rmdir", "opendir", "closedir", "truncate", "sendfile_read", "sendfile_write",
    "copy_file_range_read", "copy_file_range_write",
    "fopen", "fdopen", "fclose", "fread", "fwrite", "fseek", "ftell", "fgets",
    "fputs",
};
