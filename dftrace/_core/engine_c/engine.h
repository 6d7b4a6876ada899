/* engine.h: the C engine's one internal header (dftrace/_core/engine_c/).
 *
 * dftrace's recording engine in C (the pure-Python twin is dftrace/_core/engine.py).
 * Records are fixed-size structs (rec_t, 64 bytes) in preallocated chunks of native
 * memory, never Python objects: the garbage collector never walks them, and the
 * writer encodes them into JSON lines with the GIL released. A chunk is
 * self-contained (its records point into its own args arena by offset), so a chunk
 * could be mapped and drained by another process.
 *
 * The files of the one extension module dftrace._core._speedups:
 *   engine.h        the shared types (the record layout, chunks, the ring's layout),
 *                   the state shared between files (dft_ names, hidden), and the hot
 *                   path as static inline functions: the recording path emit_span ->
 *                   native_append / shm_append, so that every span style compiles it
 *                   into its own code and a span costs no call across files
 *   span_lifecycle.h  a span's lifecycle, span_open / span_close (every C style's only
 *                   way to open and end a span), included by engine.h at its place
 *   kept_spans.h    the spans with/start() keep open, in their stack's `open` map (a
 *                   KeptSpans): push, find on top, take; the ones start() opened, in
 *                   STATE.open_spans (a StartedSpans): add, remove (included after
 *                   span_lifecycle.h)
 *   records.c       kinds (kid -> name/cat piece), the native buffer of chunks, record()
 *   encoder.c       args fragments (plain dicts -> JSON) and the line encoder
 *   writer.c        frames to the file: encode, compress (zstd, libdeflate) and write
 *                   without the GIL; the writer thread's loop
 *   shm_producer.c  the shared-memory ring this process records into (writer="process")
 *   shm_consumer.c  ShmReader: the drainer's side of a producer's ring
 *   spans.c         the thread-stack cache, NVTX ranges, SpanWrapper (decorator),
 *                   SpanIter (.iter())
 *   traceable.c     TraceableBase (with, start/stop, update, node(args=)),
 *                   SpanBase (Span.stop)
 *   kept_spans.c    KeptSpans (a stack's `open` map, the kept spans in place, with the
 *                   mapping Python reads), OpenSpan (one kept span, for Python) and
 *                   StartedSpans (STATE.open_spans: the spans start() opened)
 *   module.c        register(): the one point where Python hands the engine its
 *                   objects; the interned names and what the engine reads
 *                   (ENGINE_READS); the method table and PyInit
 */
#ifndef DFTRACE_ENGINE_H
#define DFTRACE_ENGINE_H

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

/* Everything declared from here on is private to the module's files. */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

static inline char *put(char *o, const char *s, Py_ssize_t n) {
    memcpy(o, s, (size_t)n);
    return o + n;
}

static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* The number of decimal digits of u. */
static inline int ndigits(unsigned long long u) {
    int n = 1;
    for (;;) {
        if (u < 10) return n;
        if (u < 100) return n + 1;
        if (u < 1000) return n + 2;
        if (u < 10000) return n + 3;
        u /= 10000;
        n += 4;
    }
}

/* Decimal digits of u, two at a time, written in place from the end (the encoder
   writes seven numbers a line). */
static inline char *put_uint(char *o, unsigned long long u) {
    char *end = o + ndigits(u), *t = end;
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        t -= 2;
        memcpy(t, DIGIT_PAIRS + 2 * r, 2);
    }
    if (u >= 10)
        memcpy(t - 2, DIGIT_PAIRS + 2 * u, 2);
    else
        t[-1] = (char)('0' + u);
    return end;
}

static inline char *put_int(char *o, long long v) {
    if (v < 0) {
        *o++ = '-';
        return put_uint(o, (unsigned long long)(-(v + 1)) + 1);
    }
    return put_uint(o, (unsigned long long)v);
}

#define LIT(s) (s), (Py_ssize_t)(sizeof(s) - 1)

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

/* Grown by copying into a larger array; an old array is never freed, because the
   writer may be reading it without the GIL. */
extern kind_t *dft_kinds;
extern Py_ssize_t dft_nkinds, dft_max_kind_len;

/* ------------------------------------------------------------------------- */
/* the native buffer                                                          */

#define F_INCOMPLETE 1u
#define F_RAW 2u /* a whole line, already encoded, in the arena (shared-memory ring only) */
#define F_MORE 4u /* F_RAW: a piece of a line, continued by the next record (ring only) */
#define F_UNNESTED 8u /* no level or p_idx: a file-I/O call, outside the span tree (io_lines.c) */
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

/* The chunk list. Producers append to the tail chunk holding the GIL; the list's
   links (head, tail, the spare list, full_recs) change under qlock, so that the
   writer's loop (write_loop) can take full chunks without the GIL. The records
   buffered are appended - taken: `appended` is the producers' (GIL), `taken` the
   takers' (under qlock, read atomically). */
extern chunk_t *dft_head, *dft_tail;
extern unsigned long long dft_appended, dft_taken;
extern Py_ssize_t dft_full_recs; /* records in the chunks before the tail */
#define nbuf ((Py_ssize_t)(dft_appended - __atomic_load_n(&dft_taken, __ATOMIC_RELAXED)))

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define CURRENT_PID() ((long long)getpid())
#define HAVE_WRITE_LOOP 1
extern pthread_mutex_t dft_qlock;
extern pthread_cond_t dft_qcond;
extern int dft_loop_waiting; /* write_loop() waits on qcond */
extern int dft_kicked;       /* write_loop() must return to Python */
#define QLOCK() pthread_mutex_lock(&dft_qlock)
#define QUNLOCK() pthread_mutex_unlock(&dft_qlock)
#else
#include <process.h>
#define CURRENT_PID() ((long long)_getpid())
#define QLOCK() ((void)0)
#define QUNLOCK() ((void)0)
#endif
extern Py_ssize_t dft_batch_size; /* wake the writer at this many */
extern Py_ssize_t dft_buf_limit;
extern int dft_drop_full;
extern long long dft_ndropped;
/* Counted drops; with a shared-memory ring also in its header, so the drainer can
   write them when this process dies without finalizing. */
#define COUNT_DROP(k) do { dft_ndropped += (k); if (dft_shm) dft_shm->dropped = dft_ndropped; } while (0)
extern int dft_woken;
extern unsigned long long dft_next_id_val;
extern unsigned long long dft_sticky_gen;

void dft_free_chunks(chunk_t *c);
void dft_recycle_chunks(chunk_t *c);
/* Keeps qlock usable in the child of a fork() made from C (pthread_atfork, once). */
void dft_qlock_fork_safe(void);
chunk_t *dft_new_chunk(void);
chunk_t *dft_detach(Py_ssize_t maxn, Py_ssize_t extra_per_rec, Py_ssize_t *ntaken, size_t *upper);
int dft_make_room(void);

#define SPARE_MAX 64
extern chunk_t *dft_spare;
extern int dft_nspare;

/* ------------------------------------------------------------------------- */
/* the shared-memory ring (writer="process")                                  */
/*
 * The region (a memfd the drainer process maps too):
 *   header (4096 bytes) | kind table (SHM_KINDS_BYTES) | nslots chunk slots
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
 * Neither side trusts the region: the other side can write it. Each keeps the
 * geometry (slot count, offsets, sizes) and its own positions in its own memory,
 * and bounds every count and length it reads from the region.
 */
#define SHM_MAGIC 0x3253484d54464444ULL /* "DDFTMHS2" */
#define SHM_VERSION 2
#define SHM_HEADER_BYTES 4096
#define SHM_KINDS_BYTES (1u << 20)
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

extern shm_hdr_t *dft_shm;        /* attached: records go to the ring */
extern char *dft_shm_base;
extern shm_slot_t *dft_shm_cur;   /* the FILLING slot */
extern int dft_shm_sealed;        /* a slot was sealed since the last wake */
/* 1 while captures run beside the ring: records go to process memory, and the
   writer relays their lines to the ring (shm_append_line) as it hands them on. */
extern int dft_shm_local;
/* Spans in the ring not yet freed by the drainer, as last counted, plus those
   appended since: buffer_limit bounds the exact count (shm_held). */
extern Py_ssize_t dft_shm_est;
extern uint32_t dft_shm_nslots;
extern uint32_t dft_shm_cur_n, dft_shm_cur_alen; /* records and arena bytes of shm_cur */

void dft_shm_add_kind(const char *p, Py_ssize_t n);
void dft_shm_seal(void);
shm_slot_t *dft_shm_take(void);
int dft_shm_append_long(uint32_t kid, long long t0, long long t1, unsigned long long id,
                        unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                        uint32_t flags, long long count, const char *a, Py_ssize_t na,
                        const char *b, Py_ssize_t nb);
int dft_shm_at_limit(void);
Py_ssize_t dft_shm_held(void);

static inline shm_slot_t *slot_in(char *base, size_t slots_off, size_t slot_size, uint32_t i) {
    return (shm_slot_t *)(base + slots_off + (size_t)i * slot_size);
}

#define OWN_SLOT(i) slot_in(dft_shm_base, SHM_HEADER_BYTES + SHM_KINDS_BYTES, SHM_SLOT_BYTES, (i))

/* encoder.c */
char *dft_encode_recs(char *o, const rec_t *recs, uint32_t from, uint32_t to, const char *arena,
                      const kind_t *ks, Py_ssize_t nk, const char *pidp, Py_ssize_t npid,
                      const char *hhp, Py_ssize_t nhh, long long off, long long min_id);
char *dft_encode_chunks(chunk_t *c, char *o, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                        Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                        long long min_id);
PyObject *dft_plain_extra(PyObject *d, int fresh);
extern int dft_off_for_good;

/* writer.c (shared with the drainer's ShmReader) */
int dft_load_zstd(void);
int dft_ensure(char **buf, size_t *cap, size_t need);
#if defined(__unix__) || defined(__APPLE__)
#include <errno.h>
#include <sys/stat.h>
#define HAVE_NATIVE_WRITE 1
int dft_compress_write(int fd, int level, const char *src, size_t len, char **zb, size_t *zcap_,
                       size_t *written);
#endif
#define REC_FIXED 240 /* literals and seven numbers of at most 20 digits, per line */
/* Most slots one line may take: a reader collects at most READ_RANGES slots at once. */
#define SHM_LONG_SLOTS 63

/* Append to the ring: 0, -1 (too long for the ring: dropped), -2 (ring full, or
   no longer this process's ring). */
static inline int shm_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                      unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                      uint32_t flags, long long count, const char *a, Py_ssize_t na,
                      const char *b, Py_ssize_t nb) {
    size_t need = (size_t)(na + nb);
    if (need > SHM_ARENA)
        return dft_shm_append_long(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    if (dft_shm_cur && (dft_shm_cur_n == CHUNK_RECS || dft_shm_cur_alen + need > SHM_ARENA))
        dft_shm_seal();
    if (!dft_shm_cur && !(dft_shm_cur = dft_shm_take()))
        return -2;
    shm_slot_t *c = dft_shm_cur;
    rec_t *r = &c->recs[dft_shm_cur_n];
    r->aoff = dft_shm_cur_alen;
    r->alen = (uint32_t)need;
    if (na)
        memcpy(c->arena + dft_shm_cur_alen, a, (size_t)na);
    if (nb)
        memcpy(c->arena + dft_shm_cur_alen + na, b, (size_t)nb);
    dft_shm_cur_alen += (uint32_t)need;
    c->alen = dft_shm_cur_alen;
    r->t0 = t0;
    r->t1 = t1;
    r->id = id;
    r->parent = p;
    r->kind = kid;
    r->level_flags = ((uint32_t)lvl & LEVEL_MASK) | (flags << LEVEL_BITS);
    r->tid = tid;
    r->count = count;
    if (flags & F_RAW)
        SLOT_RAW(c)++;
    else
        dft_shm_est++;
    __atomic_store_n(&c->n, ++dft_shm_cur_n, __ATOMIC_RELEASE);
    return 0;
}


/* Append one record; -1 when memory ran out (the caller counts it as dropped). */
static inline int native_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                         unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                         uint32_t flags, long long count, const char *a, Py_ssize_t na,
                         const char *b, Py_ssize_t nb) {
    if (dft_shm && !dft_shm_local)
        return shm_append(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    chunk_t *c = dft_tail;
    if (!c || c->n == CHUNK_RECS) {
        QLOCK();
        c = dft_new_chunk();
        if (c) {
            if (dft_tail) {
                dft_tail->next = c;
                dft_full_recs += dft_tail->n;
            } else {
                dft_head = c;
            }
            dft_tail = c;
#ifdef HAVE_WRITE_LOOP
            if (dft_loop_waiting && dft_full_recs >= dft_batch_size)
                pthread_cond_signal(&dft_qcond);
#endif
        }
        QUNLOCK();
        if (!c)
            return -1;
    }
    rec_t *r = &c->recs[c->n];
    size_t need = (size_t)(na + nb);
    r->aoff = 0;
    r->alen = 0;
    if (need) {
        if (c->alen + need > c->acap) {
            size_t cap = c->acap ? c->acap * 2 : 16384;
            while (cap < c->alen + need)
                cap *= 2;
            if (cap > 0xFFFFFFFFu)
                return -1;
            char *ar = PyMem_RawRealloc(c->arena, cap);
            if (!ar)
                return -1;
            c->arena = ar;
            c->acap = cap;
        }
        if (na)
            memcpy(c->arena + c->alen, a, (size_t)na);
        if (nb)
            memcpy(c->arena + c->alen + na, b, (size_t)nb);
        r->aoff = (uint32_t)c->alen;
        r->alen = (uint32_t)need;
        c->alen += need;
    }
    r->t0 = t0;
    r->t1 = t1;
    r->id = id;
    r->parent = p;
    r->kind = kid;
    r->level_flags = ((uint32_t)lvl & LEVEL_MASK) | (flags << LEVEL_BITS);
    r->tid = tid;
    r->count = count;
    c->n++;
    dft_appended++;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the Python side the engine calls back into                                */

typedef struct {
    PyObject *local;      /* threading.local with .stk / .thread_stk */
    PyObject *resolve;    /* callable() -> Stack */
    PyObject *wait_room;  /* callable(): wait until the writer made room (may raise) */
    PyObject *wake;       /* callable(): a batch is ready */
    PyObject *unwind;     /* callable(stk, i) */
    PyObject *with_error; /* callable(extra, exc) -> Extra */
    PyObject *merge;      /* callable(sticky, extra) -> Extra (a key in both) */
    PyObject *to_extra;   /* callable(obj) -> Extra (args given as a dict) */
    PyObject *sticky_of;  /* callable(node) -> Extra or None (refresh after update()) */
    PyObject *extra_type; /* the Extra class */
    PyObject *slow_exit;  /* the Python __exit__ for every case but the common one */
} recstate_t;

extern recstate_t dft_calls;
extern PyObject *dft_update_slow; /* Node._update_py */

/* The attribute names the engine reads, interned once (module.c; each one is listed
   in ENGINE_READS under the classes it is read from). */
extern PyObject *dft_str_thread_stk, *dft_str_stk, *dft_str_on, *dft_str_kid, *dft_str_ikid,
    *dft_str_bkid, *dft_str_tid, *dft_str_open, *dft_str_extra, *dft_str_node, *dft_str_frag,
    *dft_str_mask, *dft_str_sgen, *dft_str_sticky, *dft_str__args, *dft_str__obj, *dft_str__stk, *dft_str__id,
    *dft_str_open_spans, *dft_str_max_open_spans, *dft_str_args_kw, *dft_str_args_attr,
    *dft_str_asyncio;

/* The __slots__ of dftrace's own small Python classes (Extra, Span), read and set
   in place: each slot's offset is found once from its member descriptor. For an
   instance of another class (a subclass), or where none was found (off -1),
   attribute access is used. */
typedef struct {
    PyTypeObject *type; /* borrowed: R or H holds it */
    PyObject *name;
    Py_ssize_t off;
} slot_t;
extern slot_t dft_slot_frag, dft_slot_mask, dft_slot_args, dft_slot_obj, dft_slot_stk, dft_slot_id;

/* New reference to o.<slot>; NULL with an error (AttributeError when unset). */
static inline PyObject *slot_get(PyObject *o, const slot_t *s) {
    if (s->off >= 0 && Py_TYPE(o) == s->type) {
        PyObject *v = *(PyObject **)((char *)o + s->off);
        if (v) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, s->name);
}

static inline int slot_set(PyObject *o, const slot_t *s, PyObject *v) {
    if (s->off >= 0 && Py_TYPE(o) == s->type) {
        Py_INCREF(v);
        Py_XSETREF(*(PyObject **)((char *)o + s->off), v);
        return 0;
    }
    return PyObject_SetAttr(o, s->name, v);
}

/* ------------------------------------------------------------------------- */
/* This thread's stack without a threading.local lookup                        */

/* LOCAL.stk as this thread last read it, with the stack's tid and open map (both
   fixed for a stack's life). Borrowed references: LOCAL holds the stack for the
   thread state that read it. Valid while that thread state is the current one
   (its id is never reused) and no LOCAL.stk was assigned since (Python calls
   stacks_changed() at every assignment, which moves stack_epoch). Used only when
   LOCAL is a real threading.local: a greenlet-local one is per greenlet. */
typedef struct {
    unsigned long long tsid, epoch;
    PyObject *stk, *tid, *open;
} stack_cache_t;
extern PyTypeObject dft_KeptSpansType; /* a stack's `open` map (kept_spans.h) */
#define IS_KEPT_MAP(o) (Py_TYPE(o) == &dft_KeptSpansType)
#ifdef _MSC_VER
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif
extern THREAD_LOCAL stack_cache_t dft_stack_cache;
extern unsigned long long dft_stack_epoch;
extern int dft_stack_cache_ok;

static inline int cache_valid(void) {
    return dft_stack_cache.stk && dft_stack_cache.epoch == dft_stack_epoch &&
           dft_stack_cache.tsid == PyThreadState_GetID(PyThreadState_Get());
}

/* New reference to LOCAL.stk (None: ask resolve()); NULL with an error. */
static inline PyObject *local_stk(void) {
    if (cache_valid()) {
        Py_INCREF(dft_stack_cache.stk);
        return dft_stack_cache.stk;
    }
    PyObject *stk = PyObject_GetAttr(dft_calls.local, dft_str_stk);
    if (!stk || !dft_stack_cache_ok || !PyList_Check(stk))
        return stk;
    PyObject *tid = PyObject_GetAttr(stk, dft_str_tid), *open = tid ? PyObject_GetAttr(stk, dft_str_open) : NULL;
    if (open && IS_KEPT_MAP(open)) {
        dft_stack_cache.stk = stk;
        dft_stack_cache.tid = tid;
        dft_stack_cache.open = open;
        dft_stack_cache.epoch = dft_stack_epoch;
        dft_stack_cache.tsid = PyThreadState_GetID(PyThreadState_Get());
    }
    PyErr_Clear();
    Py_XDECREF(tid);
    Py_XDECREF(open);
    return stk;
}

/* New references to a stack's tid / open map. */
static inline PyObject *stk_tid(PyObject *stk) {
    if (stk == dft_stack_cache.stk && cache_valid()) {
        Py_INCREF(dft_stack_cache.tid);
        return dft_stack_cache.tid;
    }
    return PyObject_GetAttr(stk, dft_str_tid);
}

static inline PyObject *stk_open(PyObject *stk) {
    if (stk == dft_stack_cache.stk && cache_valid()) {
        Py_INCREF(dft_stack_cache.open);
        return dft_stack_cache.open;
    }
    return PyObject_GetAttr(stk, dft_str_open);
}


/* buffer_limit spans wait: in process memory, or in the ring (see shm_held). */
#define AT_LIMIT() (dft_shm && !dft_shm_local ? dft_shm_at_limit() : nbuf >= dft_buf_limit)

/* A batch is ready: wake the writer once per batch, and again every 4096 records
   while it has not drained (its wake() makes a producer wait when the writer has
   fallen a flush interval behind). */
static inline void wake_writer(void) {
    if (!dft_calls.wake || (dft_woken && (nbuf & 0xFFF)))
        return;
    dft_woken = 1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallNoArgs(dft_calls.wake);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* The fragment bytes of an Extra (or None): a borrowed pointer into the
   Extra's bytes, valid while the caller holds it. */
static inline int extra_piece(PyObject *x, const char **s, Py_ssize_t *n) {
    *s = NULL;
    *n = 0;
    if (x == NULL || x == Py_None)
        return 0;
    PyObject *f = slot_get(x, &dft_slot_frag);
    if (!f)
        return -1;
    if (!PyBytes_Check(f)) {
        Py_DECREF(f);
        PyErr_SetString(PyExc_TypeError, "Extra.frag must be bytes");
        return -1;
    }
    *s = PyBytes_AS_STRING(f);
    *n = PyBytes_GET_SIZE(f);
    Py_DECREF(f); /* the Extra keeps it alive */
    return 0;
}

/* The key mask of an Extra (read only where two fragments meet). */
static inline int extra_mask(PyObject *x, unsigned long long *mask) {
    PyObject *m = slot_get(x, &dft_slot_mask);
    if (!m)
        return -1;
    *mask = PyLong_AsUnsignedLongLongMask(m);
    Py_DECREF(m);
    if (*mask == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return 0;
}

static inline int get_ull(PyObject *o, unsigned long long *out) {
    /* ids, parents and tids are small ints: read in place (one 30-bit digit) */
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(o) && PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        Py_ssize_t c = PyUnstable_Long_CompactValue((PyLongObject *)o);
        if (c >= 0) {
            *out = (unsigned long long)c;
            return 0;
        }
    }
#else
    if (PyLong_CheckExact(o) && (Py_SIZE(o) == 0 || Py_SIZE(o) == 1)) {
        *out = Py_SIZE(o) ? (unsigned long long)((PyLongObject *)o)->ob_digit[0] : 0;
        return 0;
    }
#endif
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* NVTX ranges (nvtx=True): each span also opens one, through nvtx_ranges.py    */

#if defined(__GNUC__) || defined(__clang__)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define likely(x) __builtin_expect(!!(x), 1)
#else
#define unlikely(x) (x)
#define likely(x) (x)
#endif

/* Off, a span pays one predictable branch on this flag: NVTX_OPEN / NVTX_CLOSE. */
extern int dft_nvtx_on;
void dft_nvtx_open(uint32_t kid, PyObject *id, PyObject *stk, int pairs);
void dft_nvtx_close(PyObject *id);

#define NVTX_OPEN(kid, id, stk, pairs) \
    do { if (unlikely(dft_nvtx_on)) dft_nvtx_open((kid), (id), (stk), (pairs)); } while (0)
#define NVTX_CLOSE(id) \
    do { if (unlikely(dft_nvtx_on)) dft_nvtx_close(id); } while (0)


/* The recording primitive. Returns 0 (recorded, or dropped and counted) or -1 with
   an exception that must reach the caller (a signal's exception during back-pressure).
   Any other failure is swallowed and counted: recording never breaks the program. */
static inline int emit_span(uint32_t kid, long long t0, long long t1, PyObject *id, PyObject *p,
                     Py_ssize_t lvl, PyObject *tid, PyObject *sticky, PyObject *x,
                     long long count, uint32_t flags) {
    NVTX_CLOSE(id);
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    if (unlikely(PyErr_Occurred() != NULL))
        PyErr_Fetch(&et, &ev, &tb); /* an exception the span is closing over stays as it is */
    int rc = 0;
    PyObject *own = NULL, *merged = NULL;
    if (AT_LIMIT()) {
        if (dft_make_room() < 0) {
            COUNT_DROP(1);
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            return -1;
        }
        if (AT_LIMIT()) {
            COUNT_DROP(1);
            goto done;
        }
    }
    const char *a, *b;
    Py_ssize_t na, nb;
    unsigned long long ma = 0, mb = 0, iv, pv, tv;
    if (x != NULL && x != Py_None && Py_TYPE(x) != (PyTypeObject *)dft_calls.extra_type) {
        own = PyObject_CallOneArg(dft_calls.to_extra, x);
        if (!own)
            goto fail;
        x = own;
    }
    if (extra_piece(sticky, &a, &na) < 0 || extra_piece(x, &b, &nb) < 0)
        goto fail;
    if (na && nb && (extra_mask(sticky, &ma) < 0 || extra_mask(x, &mb) < 0))
        goto fail;
    if (ma & mb) {
        /* maybe a key in both: the span's own args win; let Python merge them */
        merged = PyObject_CallFunctionObjArgs(dft_calls.merge, sticky, x, NULL);
        if (!merged || extra_piece(merged, &b, &nb) < 0)
            goto fail;
        a = NULL;
        na = 0;
    }
    if (get_ull(id, &iv) < 0 || get_ull(p, &pv) < 0 || get_ull(tid, &tv) < 0)
        goto fail;
    int ar = native_append(kid, t0, t1, iv, pv, lvl, tv, flags, count, a, na, b, nb);
    if (ar == -2) { /* the shared ring is full: as at the buffer limit */
        if (dft_make_room() < 0) {
            COUNT_DROP(1);
            Py_XDECREF(own); Py_XDECREF(merged);
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            return -1;
        }
        ar = native_append(kid, t0, t1, iv, pv, lvl, tv, flags, count, a, na, b, nb);
    }
    if (ar < 0) {
        COUNT_DROP(1);
        goto done;
    }
    if (dft_shm_sealed) { /* a slot of the ring is full: tell the drainer */
        dft_shm_sealed = 0;
        dft_woken = 0;
        wake_writer();
    } else if (nbuf >= dft_batch_size)
        wake_writer();
    goto done;
fail:
    PyErr_Clear();
    COUNT_DROP(1);
done:
    Py_XDECREF(own);
    Py_XDECREF(merged);
    if (et || PyErr_Occurred())
        PyErr_Restore(et, ev, tb);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* nodes and uses: the fields the hot paths read, in the object itself         */

/* A node's or use's __enter__ / __exit__, bound without an allocation: each
   traceable holds the two in its own memory, and the descriptors on TraceableBase
   hand them out (traceable.c). Unreferenced, a hook's refcount is 0; taken, it
   holds a reference to its owner, dropped when the last holder lets it go (its
   tp_dealloc frees nothing). The `with` statement looks both up on every entry:
   this saves it two bound-method objects per block. */
#if !defined(Py_GIL_DISABLED) && !defined(Py_TRACE_REFS)
#define DFT_INLINE_HOOKS 1
#endif
typedef struct {
    PyObject_HEAD
    PyObject *owner;  /* the traceable it belongs to (a reference while taken) */
    vectorcallfunc vectorcall;
} hook_t;

#define PEND_MAX 4

typedef struct {
    PyObject_HEAD
    PyObject *node;   /* _node: the tree node naming the events (itself for a node) */
    PyObject *extra;  /* _extra: the use's own args (Extra or None) */
    PyObject *forced; /* _forced: a use's enable= (None: follows its node) */
    PyObject *on;     /* _on: a node records now (True/False) */
    PyObject *sticky; /* _sticky: its sticky args (Extra or None) as of _sgen */
    unsigned long long sgen;
    unsigned int kid, ikid, bkid; /* kind ids of <name>, <name>.iter, <name>.block */
    PyObject *raw;    /* a use's args not encoded yet (made while its node was off) */
    PyObject *parent; /* _parent: the node above (None for a root) */
    PyObject *own;    /* _own: a node's own sticky args (update()), Extra or None */
    PyObject *pending; /* _pending: sticky args given while nothing recorded (dict) */
    /* The last update(k=v, ...) made while nothing recorded, not yet in `pending`:
       its keyword names (the call site's own tuple) and values. The next call from
       the same site replaces the values; anything that reads `pending` first moves
       them there (pending_flush). */
    PyObject *pend_names;
    PyObject *pend_vals[PEND_MAX];
    hook_t enter_hook, exit_hook; /* bound __enter__ / __exit__ (see hook_t) */
    vectorcallfunc vectorcall; /* node(...) without a keyword dict */
} TraceableObject;

extern PyTypeObject dft_TraceableBaseType;
extern PyObject *dft_gate; /* GATE: what a use forced on follows */

#define AS_T(o) ((TraceableObject *)(o))
int dft_pending_flush(TraceableObject *t); /* traceable.c; -1 with an error */
PyObject *dft_traceable_call(PyObject *self, PyObject *args, PyObject *kwargs); /* its tp_call */
/* A node or use: one comparison for the tree's classes (only TraceableBase and its
   subclasses have its tp_call), a walk of the MRO for one with a __call__ of its own. */
static inline int IS_T(PyObject *o) {
    return Py_TYPE(o)->tp_call == dft_traceable_call || PyObject_TypeCheck(o, &dft_TraceableBaseType);
}

/* GATE._on, read in place (its class's slot). */
extern slot_t dft_slot_gate_on;

/* Nothing was ever given an id in this process: no span is open anywhere, so an
   __exit__ or stop() has nothing to close (tracing never started). */
#define NOTHING_OPENED_EVER() (dft_next_id_val == 1)

/* Whether `o` (a node, a use, or the GATE) records now; -1 with an error. */
static inline int is_on(PyObject *o) {
    if (o == dft_gate && dft_slot_gate_on.off >= 0 && Py_TYPE(o) == dft_slot_gate_on.type) {
        PyObject *v = *(PyObject **)((char *)o + dft_slot_gate_on.off);
        if (v == Py_True || v == Py_False)
            return v == Py_True;
    }
    if (IS_T(o)) {
        TraceableObject *t = AS_T(o);
        if (t->on)
            return t->on == Py_True;
        if (t->forced == NULL || t->forced == Py_None) {
            if (t->node && t->node != o && IS_T(t->node) && AS_T(t->node)->on)
                return AS_T(t->node)->on == Py_True;
        } else if (t->forced == Py_False) {
            return 0;
        } else if (dft_gate) {
            return is_on(dft_gate);
        }
    }
    PyObject *on = PyObject_GetAttr(o, dft_str_on);
    if (!on)
        return -1;
    int r = PyObject_IsTrue(on);
    Py_DECREF(on);
    return r;
}

/* The sticky args of a node now: its parent's, then its own (new reference: an
   Extra or None). Refreshed once per update() generation; where no node of the
   chain has args of its own beyond one, no object is made at all. */
static inline PyObject *sticky_chain(TraceableObject *t) {
    if (t->sgen == dft_sticky_gen) {
        PyObject *st = t->sticky ? t->sticky : Py_None;
        Py_INCREF(st);
        return st;
    }
    if (t->pend_names && dft_pending_flush(t) < 0)
        return NULL;
    if (t->pending && PyDict_Check(t->pending) && PyDict_GET_SIZE(t->pending))
        return PyObject_CallOneArg(dft_calls.sticky_of, (PyObject *)t); /* encodes them first */
    PyObject *base;
    if (t->parent && t->parent != Py_None && IS_T(t->parent)) {
        base = sticky_chain(AS_T(t->parent));
        if (!base)
            return NULL;
    } else {
        base = Py_None;
        Py_INCREF(base);
    }
    PyObject *own = t->own, *st;
    if (own == NULL || own == Py_None) {
        st = base;
    } else if (base == Py_None) {
        Py_DECREF(base);
        st = own;
        Py_INCREF(st);
    } else {
        st = PyObject_CallFunctionObjArgs(dft_calls.merge, base, own, NULL);
        Py_DECREF(base);
        if (!st)
            return NULL;
    }
    Py_INCREF(st);
    Py_XSETREF(t->sticky, st);
    t->sgen = dft_sticky_gen;
    return st;
}

/* The sticky args of `node` now (new reference: an Extra or None). */
static inline PyObject *node_sticky(PyObject *node) {
    if (IS_T(node))
        return sticky_chain(AS_T(node));
    PyObject *g = PyObject_GetAttr(node, dft_str_sgen);
    if (!g)
        return NULL;
    unsigned long long gv = PyLong_AsUnsignedLongLongMask(g);
    Py_DECREF(g);
    if (gv == dft_sticky_gen)
        return PyObject_GetAttr(node, dft_str_sticky);
    return PyObject_CallOneArg(dft_calls.sticky_of, node);
}

static inline PyObject *new_id(void) { return PyLong_FromUnsignedLongLong(dft_next_id_val++); }

/* Drop the top of a non-empty stack (a list keeps its allocation when it shrinks). */
static inline int drop_top(PyObject *stk) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    PyObject *top = PyList_GET_ITEM(stk, n - 1);
    Py_SET_SIZE(stk, n - 1);
    Py_DECREF(top);
    return 0;
}

/* Remove span `id` from the top of `stk`; anything left above it is unwound. */
static inline int stack_pop(PyObject *stk, PyObject *id, long long t) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (n > 0 && PyList_GET_ITEM(stk, n - 1) == id)
        return drop_top(stk);
    PyObject *at = PyLong_FromLongLong(t);
    if (!at)
        return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(dft_calls.unwind, stk, id, at, NULL);
    Py_DECREF(at);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

#include "span_lifecycle.h" /* span_open / span_close */
#include "kept_spans.h"     /* the spans with/start() keep open: the stack's `open` map */

/* asyncio's running loop, or None; asyncio is never imported from here: until the
   program imports it, no loop can be running. Until then sys.modules is searched for
   it only when its size changed since the last search (an import adds entries). */
extern PyObject *dft_asyncio_get_running_loop;
extern PyObject *dft_modules_seen; /* sys.modules when asyncio was last not in it */
extern Py_ssize_t dft_modules_seen_size;

static inline PyObject *running_loop(void) {
    if (dft_asyncio_get_running_loop == NULL) {
        PyObject *mods = PyImport_GetModuleDict();
        if (mods == dft_modules_seen && PyDict_GET_SIZE(mods) == dft_modules_seen_size)
            Py_RETURN_NONE;
        PyObject *aio = mods ? PyDict_GetItemWithError(mods, dft_str_asyncio) : NULL;
        if (aio == NULL) {
            PyErr_Clear();
            if (mods && PyDict_Check(mods)) {
                dft_modules_seen = mods;
                dft_modules_seen_size = PyDict_GET_SIZE(mods);
            }
            Py_RETURN_NONE;
        }
        dft_asyncio_get_running_loop = PyObject_GetAttrString(aio, "_get_running_loop");
        if (dft_asyncio_get_running_loop == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallNoArgs(dft_asyncio_get_running_loop);
}

/* The stack spans of this thread (or asyncio task) nest on; NULL with an error. */
static inline PyObject *current_stack(void) {
    PyObject *loop = running_loop();
    if (!loop)
        return NULL;
    int in_loop = (loop != Py_None);
    Py_DECREF(loop);
    if (!in_loop) {
        PyObject *stk = local_stk();
        if (!stk)
            return NULL;
        if (stk != Py_None)
            return stk;
        Py_DECREF(stk);
    }
    return PyObject_CallNoArgs(dft_calls.resolve);
}


typedef struct {
    PyObject *state;      /* _recorder.STATE (its open_spans map is replaced after fork) */
    PyTypeObject *span;   /* _nodes.Span, allocated here and filled through its slots */
    PyObject *no_span;    /* the Span returned when nothing is recorded */
    PyObject *start_slow; /* _Traceable._start_py(self, *args, **kwargs) */
    PyObject *stop_slow;  /* _Traceable._stop_py(self, *args, **kwargs) */
    PyTypeObject *use;    /* _nodes.Use, allocated here for node(args={...}) */
    PyObject *call_slow;  /* _Traceable._call_py(self, *args, **kwargs) */
    PyObject *span_stop_slow; /* Span._stop_py(self, args=None) */
    PyObject *gate;       /* GATE */
    PyObject *off_use;    /* OFF_USE: node(...) when tracing is off by configuration */
} hookstate_t;

extern hookstate_t dft_hooks;

/* STATE.open_spans (a StartedSpans), as last read: STATE replaces it only where it resets
   (reset(), after a fork), and both then call the engine's reset()/after_fork(),
   which forget it. */
extern PyObject *dft_open_spans_cache;
static inline PyObject *open_spans(void) {
    PyObject *d = dft_open_spans_cache;
    if (!d) {
        d = dft_hooks.state ? PyObject_GetAttr(dft_hooks.state, dft_str_open_spans) : NULL;
        if (!d || !IS_STARTED_MAP(d))
            return d;
        dft_open_spans_cache = d; /* the cache's reference */
    }
    Py_INCREF(d);
    return d;
}

/* spans.c */
uint32_t dft_node_kid(PyObject *node, PyObject *name);
extern PyTypeObject dft_SpanWrapperType, dft_SpanIterType;
/* traceable.c */
extern PyTypeObject dft_SpanBaseType;
int dft_traceable_ready(void); /* TraceableBase and its __enter__/__exit__ hooks */
int dft_traceable_subclasses(void); /* at register(): the subclasses defined so far */
/* shm_consumer.c */
extern PyTypeObject dft_ShmReaderType;
extern PyObject *dft_RingError;

/* The module's functions (module.c's method table), by the file that defines them. */
/* records.c */
PyObject *dft_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dft_add_kind(PyObject *self, PyObject *arg);
PyObject *dft_reset(PyObject *self, PyObject *unused);
PyObject *dft_after_fork(PyObject *self, PyObject *unused);
PyObject *dft_set_limits(PyObject *self, PyObject *args);
PyObject *dft_buffered(PyObject *self, PyObject *unused);
PyObject *dft_get_dropped(PyObject *self, PyObject *unused);
PyObject *dft_set_dropped(PyObject *self, PyObject *arg);
PyObject *dft_new_id_py(PyObject *self, PyObject *unused);
PyObject *dft_bump_sticky_gen(PyObject *self, PyObject *unused);
PyObject *dft_get_sticky_gen(PyObject *self, PyObject *unused);
PyObject *dft_clock_ns(PyObject *self, PyObject *unused);
/* io_lines.c */
PyObject *dft_io_emit(PyObject *self, PyObject *args);
/* encoder.c */
PyObject *dft_set_options(PyObject *self, PyObject *args);
PyObject *dft_plain_fragment_py(PyObject *self, PyObject *d);
/* writer.c */
PyObject *dft_drain(PyObject *self, PyObject *args);
PyObject *dft_drain_write(PyObject *self, PyObject *args);
PyObject *dft_in_flight(PyObject *self, PyObject *unused);
PyObject *dft_write_loop(PyObject *self, PyObject *args);
PyObject *dft_kick(PyObject *self, PyObject *unused);
PyObject *dft_writing_since(PyObject *self, PyObject *unused);
PyObject *dft_frames_written(PyObject *self, PyObject *unused);
PyObject *dft_native_write(PyObject *self, PyObject *unused);
/* shm_producer.c */
PyObject *dft_shm_attach(PyObject *self, PyObject *args);
PyObject *dft_shm_detach(PyObject *self, PyObject *unused);
PyObject *dft_shm_finish(PyObject *self, PyObject *unused);
PyObject *dft_shm_set_local(PyObject *self, PyObject *arg);
PyObject *dft_shm_seal_now(PyObject *self, PyObject *unused);
PyObject *dft_shm_state(PyObject *self, PyObject *unused);
PyObject *dft_shm_append_line(PyObject *self, PyObject *arg);
/* spans.c */
PyObject *dft_set_nvtx(PyObject *self, PyObject *args);
PyObject *dft_stacks_changed(PyObject *self, PyObject *unused);
PyObject *dft_close_open_blocks(PyObject *self, PyObject *args);
PyObject *dft_open_block_kinds(PyObject *self, PyObject *unused);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif
#endif /* DFTRACE_ENGINE_H */
