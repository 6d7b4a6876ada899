/* common.h: what every unit of the engine shares (dftrace/_core/engine_c/; the map
 * is in CONTRIBUTING.md, "The C engine's map"): the Python headers, the platform's
 * parts, the 64-byte record and its chunk, the shared-memory ring's layout, and
 * the small helpers of objects (references, free lists). No state: each unit
 * declares its own in its own header. */
#ifndef DFTRACE_COMMON_H
#define DFTRACE_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <limits.h>
#include <structmember.h>
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h> /* included by Python.h from 3.11 on */
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>
#define CURRENT_PID() ((long long)getpid())
#define HAVE_WRITE_LOOP 1  /* the writer thread's loop, without the GIL (writer.c) */
#define HAVE_NATIVE_WRITE 1 /* frames compressed and written in C (writer.c) */
#else
#include <process.h>
#define CURRENT_PID() ((long long)_getpid())
#endif

#ifdef _MSC_VER
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif

/* Compiled into each caller whatever its size: the recording path's pieces, so that
   a span pays no call between them. */
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static __forceinline
#endif

/* An exact int of at most one digit (below 2^30 in size), read in place: 1 and its
   value, else 0 (ids, steps, sizes and counts are; PyLong's conversions are slower). */
static inline int small_int(PyObject *v, long long *x) {
    if (!PyLong_CheckExact(v))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)v))
        return 0;
    *x = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
#else
    Py_ssize_t n = Py_SIZE(v);
    if (n == 1)
        *x = (long long)((PyLongObject *)v)->ob_digit[0];
    else if (n == 0)
        *x = 0;
    else if (n == -1)
        *x = -(long long)((PyLongObject *)v)->ob_digit[0];
    else
        return 0;
#endif
    return 1;
}

/* What a unit declares is private to the module's files (DFT_HIDDEN_BEGIN ...
   DFT_HIDDEN_END around each header's declarations). */
#if defined(__GNUC__) || defined(__clang__)
#define DFT_HIDDEN_BEGIN _Pragma("GCC visibility push(hidden)")
#define DFT_HIDDEN_END _Pragma("GCC visibility pop")
#else
#define DFT_HIDDEN_BEGIN
#define DFT_HIDDEN_END
#endif

DFT_HIDDEN_BEGIN

#if defined(__GNUC__) || defined(__clang__)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define likely(x) __builtin_expect(!!(x), 1)
#else
#define unlikely(x) (x)
#define likely(x) (x)
#endif

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------------- */
/* kinds: kid -> the `,"name":..,"cat":..` piece of its lines                  */

typedef struct {
    char *piece;
    Py_ssize_t n;
} kind_t;

/* ------------------------------------------------------------------------- */
/* the record: 64 bytes, its args in its chunk's arena                         */

#define F_INCOMPLETE 1u
#define F_RAW 2u /* a whole line, already encoded, in the arena (shared-memory ring only) */
#define F_MORE 4u /* F_RAW: a piece of a line, continued by the next record (ring only) */
#define F_IO 8u /* a file-I/O call (io_lines.c), outside the span tree (no level or p_idx): its
                  file's hash in `parent`, errno in the level bits, its values raw in the
                  args (dft_io_args_t, io_sink.h) */
#define F_OPEN_WRITTEN 16u /* an open-span table entry written already, incomplete (never a record's) */
#define LEVEL_BITS 24
#define LEVEL_MASK ((1u << LEVEL_BITS) - 1)

typedef struct {
    int64_t t0, t1;
    uint64_t id, parent;
    uint32_t kind;
    uint32_t level_flags; /* level in the low 24 bits, flags above */
    uint64_t tid;
    int64_t count; /* -1: none */
    uint32_t aoff, alen; /* args bytes in the chunk's arena */
} rec_t;

/* A record's fields but its args (aoff, alen). */
static inline void rec_fill(rec_t *r, uint32_t kid, long long t0, long long t1, unsigned long long id,
                            unsigned long long p, Py_ssize_t lvl, unsigned long long tid, uint32_t flags,
                            long long count) {
    r->t0 = t0;
    r->t1 = t1;
    r->id = id;
    r->parent = p;
    r->kind = kid;
    r->level_flags = ((uint32_t)lvl & LEVEL_MASK) | (flags << LEVEL_BITS);
    r->tid = tid;
    r->count = count;
}

/* A record's args bytes, the two pieces one after the other at `at`. */
static inline void put_args(char *at, const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) {
    if (na)
        memcpy(at, a, (size_t)na);
    if (nb)
        memcpy(at + na, b, (size_t)nb);
}

/* A chunk is its header (40 bytes) and CHUNK_RECS records: 4095 makes it, with the
   allocator's own 16 bytes, exactly 64 pages (256 KiB), so a buffered record costs
   64 bytes of memory, not 65. */
#define CHUNK_RECS 4095

typedef struct chunk {
    struct chunk *next;
    uint32_t n;
    size_t alen, acap;
    char *arena;
    rec_t recs[CHUNK_RECS];
} chunk_t;

/* ------------------------------------------------------------------------- */
/* the shared-memory ring (writer="process")                                  */
/*
 * The region (a memfd the drainer process maps too):
 *   header (4096 bytes) | kind table (SHM_KINDS_BYTES) | open spans (SHM_OPEN_BYTES)
 *   | nslots chunk slots
 * A slot is FREE, FILLING (this process appends to it) or FULL (sealed). Slots are
 * taken in sequence order (seq). A record becomes visible by the store-release of
 * the slot's n after its fields and args bytes were written, so a reader that
 * load-acquires n finds complete records only: a record being written when the
 * process dies is not counted in n and is never read. Only the drainer sets a slot
 * FREE again, after the bytes encoded from it were written (its commit), so a
 * reader that takes over after the drainer died starts at the last commit and
 * finds every record not yet written. Kind pieces are appended the same way
 * (bytes, then the committed count).
 *
 * The open-span table holds a record (t1 unset, flagged incomplete) for each span
 * open now, at slot (id + k) % SHM_OPEN_SLOTS for the first k < OPEN_PROBES free:
 * the id is stored last (release) and zeroed when the span ends. A drainer whose
 * producer died without finalizing (SIGKILL, os._exit) writes those left, ending
 * then, so spans open at the kill are in the file as incomplete; `open_not_kept`
 * counts the open spans the table had no room for. A finalize writes those left
 * itself, flagged F_OPEN_WRITTEN: their ends, if they come, record nothing.
 *
 * Neither side trusts the region: the other side can write it. Each keeps the
 * geometry (slot count, offsets, sizes) and its own positions in its own memory,
 * and bounds every count and length it reads from the region.
 */
#define SHM_MAGIC 0x3253484d54464444ULL /* "DDFTMHS2" */
#define SHM_VERSION 3
#define SHM_HEADER_BYTES 4096
#define SHM_KINDS_BYTES (1u << 20)
#define SHM_OPEN_SLOTS 4096u /* a power of two */
#define SHM_OPEN_BYTES (SHM_OPEN_SLOTS * sizeof(rec_t))
#define OPEN_PROBES 4
#define SHM_SLOTS_OFF (SHM_HEADER_BYTES + SHM_KINDS_BYTES + SHM_OPEN_BYTES)
#define SHM_ARENA (256u * 1024u)
#define SLOT_FREE 0u
#define SLOT_FILLING 1u
#define SLOT_FULL 2u

/* Where the drainer's file stands: every record before (seq, pos) is in the file
   <base>[.run][.part<part>], whose first `size` bytes are whole frames. */
typedef struct {
    uint64_t seq;
    uint32_t pos, run;
    uint32_t part, valid;
    uint64_t size; /* NO_FILE: none of its own yet (or a FIFO) */
} shm_commit_t;
#define NO_FILE UINT64_MAX

typedef struct {
    uint64_t magic;
    uint32_t version, nslots;
    uint64_t slot_size, slots_off, kinds_off, kinds_cap;
    uint32_t nkinds;    /* kind entries committed (release) */
    uint32_t finalized; /* 1: the producer wrote its trailer lines and ended */
    uint64_t kinds_len; /* bytes of the kind table used */
    int64_t dropped;    /* the producer's counted drops */
    uint64_t next_seq;
    int64_t drainer_busy_ns; /* CLOCK_MONOTONIC start of the drainer's write under way, 0 idle */
    int64_t producer_pid;
    uint64_t commit_gen; /* commit[commit_gen & 1] is the latest (release) */
    shm_commit_t commit[2];
    uint64_t open_off, open_cap; /* the open-span table: where, and how many records */
    int64_t open_not_kept;       /* spans open now that the table had no room for */
} shm_hdr_t;

typedef struct {
    uint32_t state;
    uint32_t n; /* committed records (release) */
    uint64_t seq;
    uint32_t alen, pad;
    uint64_t reserved[5];
    rec_t recs[CHUNK_RECS];
    char arena[SHM_ARENA];
} shm_slot_t;

/* A slot's `reserved[0]` (the producer's own word, never read by a reader): how many
   of its records are lines encoded already (metadata, relayed lines), not spans. */
#define SLOT_RAW(s) ((s)->reserved[0])

#define SHM_SLOT_BYTES ((sizeof(shm_slot_t) + 4095) & ~(size_t)4095)
typedef char shm_header_fits[sizeof(shm_hdr_t) <= SHM_HEADER_BYTES ? 1 : -1];
/* Most slots one line may take: a reader collects at most READ_RANGES (64) slots at
   once (shm_consumer.c). */
#define SHM_LONG_SLOTS 63

static inline shm_slot_t *slot_in(char *base, size_t slots_off, size_t slot_size, uint32_t i) {
    return (shm_slot_t *)(base + slots_off + (size_t)i * slot_size);
}

/* ------------------------------------------------------------------------- */
/* objects                                                                    */

/* An object's references listed once, as their places, for both its tp_traverse
   (`visit` given) and its tp_clear (`visit` NULL: each one cleared, in order). */
static inline int visit_refs(PyObject **const refs[], size_t n, visitproc visit, void *arg) {
    for (size_t i = 0; i < n; i++) {
        if (visit)
            Py_VISIT(*refs[i]);
        else
            Py_CLEAR(*refs[i]);
    }
    return 0;
}
#define NREFS(refs) (sizeof(refs) / sizeof((refs)[0]))

/* The objects the engine makes by the thousand and that live briefly (an OpenSpan
   for Python, the Span start() returns, the Use of node(args=)): a few are kept
   for the next ones, their memory (garbage-collector header included) with them,
   as CPython keeps its tuples. A free list serves one class at a time. */
#define FREE_MAX 16
typedef struct {
    PyObject *o[FREE_MAX];
    int n;
    PyTypeObject *type; /* the class the kept memory is sized for (NULL: none) */
} freelist_t;

/* A new instance of `tp` (zeroed, tracked): a kept one where there is one. */
static inline PyObject *freelist_alloc(freelist_t *fl, PyTypeObject *tp) {
    if (tp == fl->type && fl->n) {
        PyObject *o = fl->o[--fl->n];
        memset((char *)o + sizeof(PyObject), 0, (size_t)tp->tp_basicsize - sizeof(PyObject));
        PyObject_Init(o, tp); /* its type (held, for a heap class) and a reference count of 1 */
        PyObject_GC_Track(o);
        return o;
    }
    return tp->tp_alloc(tp, 0);
}

/* The end of a tp_dealloc: `o` (untracked, its fields cleared) is kept, or freed.
   (An instance of a heap class then lets its class go: the caller's Py_DECREF.) */
static inline void freelist_free(freelist_t *fl, PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    if (tp == fl->type && fl->n < FREE_MAX)
        fl->o[fl->n++] = o;
    else
        tp->tp_free(o);
}

/* Serve `tp` from now on (NULL: no class), the objects kept before freed: a Python
   class qualifies when its instances are plain (garbage-collected, `size` bytes, no
   __dict__, no weak references, no finalizer), and then deallocates with `dealloc`
   (which ends with freelist_free, then lets the class go). */
static inline void freelist_serve(freelist_t *fl, PyTypeObject *tp, Py_ssize_t size, destructor dealloc) {
    while (fl->n)
        PyObject_GC_Del(fl->o[--fl->n]);
    fl->type = NULL;
    if (tp && (tp->tp_flags & Py_TPFLAGS_HEAPTYPE) && (tp->tp_flags & Py_TPFLAGS_HAVE_GC) &&
        tp->tp_basicsize == size && tp->tp_dictoffset == 0 && tp->tp_weaklistoffset == 0 &&
        tp->tp_finalize == NULL && tp->tp_del == NULL) {
        tp->tp_dealloc = dealloc;
        fl->type = tp;
    }
}

DFT_HIDDEN_END
#endif /* DFTRACE_COMMON_H */
