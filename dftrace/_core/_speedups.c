/* dftrace's recording engine in C (the pure-Python twin is dftrace/_recorder.py).
 *
 * Records are fixed-size structs (rec_t, 64 bytes) in preallocated chunks of native
 * memory, never Python objects: the garbage collector never walks them, and the
 * writer encodes them into JSON lines with the GIL released. A chunk is
 * self-contained (its records point into its own args arena by offset), so a chunk
 * could be mapped and drained by another process.
 *
 *   record(kid, t0, t1, id, parent, level, tid, sticky, extra, count, flags)
 *       The one recording primitive every style calls (C wrappers call emit_span
 *       directly). `sticky` and `extra` are Extra objects (or None): the sticky args
 *       in force when the span started and the span's own args, both already
 *       encoded as JSON fragments; their bytes are copied into the chunk's arena.
 *   drain(max_records, pid_piece, hh_piece, offset_ns, min_id) -> (bytes, n)
 *       Detach up to max_records (whole chunks) with the GIL held, encode them with
 *       the GIL released, return the JSON lines.
 *   SpanWrapper / TraceableBase / SpanIter
 *       Decorator, with/start/stop and .iter() in C, all recording through emit_span.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <structmember.h>

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
static kind_t *kinds = NULL;
static Py_ssize_t nkinds = 0, capkinds = 0, max_kind_len = 0;

static void shm_add_kind(const char *p, Py_ssize_t n);

static PyObject *add_kind(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "add_kind() takes bytes");
        return NULL;
    }
    if (nkinds == capkinds) {
        Py_ssize_t cap = capkinds ? capkinds * 2 : 1024;
        kind_t *grown = PyMem_RawMalloc(sizeof(kind_t) * (size_t)cap);
        if (!grown)
            return PyErr_NoMemory();
        if (nkinds)
            memcpy(grown, kinds, sizeof(kind_t) * (size_t)nkinds);
        kinds = grown; /* the old array stays allocated (see above) */
        capkinds = cap;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    char *p = PyMem_RawMalloc((size_t)(n ? n : 1));
    if (!p)
        return PyErr_NoMemory();
    memcpy(p, PyBytes_AS_STRING(arg), (size_t)n);
    kinds[nkinds].piece = p;
    kinds[nkinds].n = n;
    if (n > max_kind_len)
        max_kind_len = n;
    shm_add_kind(p, n);
    return PyLong_FromSsize_t(nkinds++);
}

/* ------------------------------------------------------------------------- */
/* the native buffer                                                          */

#define F_INCOMPLETE 1u
#define F_RAW 2u /* a whole line, already encoded, in the arena (shared-memory ring only) */
#define F_MORE 4u /* F_RAW: a piece of a line, continued by the next record (ring only) */
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
static chunk_t *head = NULL, *tail = NULL;
static unsigned long long appended = 0, taken = 0;
static Py_ssize_t full_recs = 0; /* records in the chunks before the tail */
#define nbuf ((Py_ssize_t)(appended - __atomic_load_n(&taken, __ATOMIC_RELAXED)))

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define CURRENT_PID() ((long long)getpid())
#define HAVE_WRITE_LOOP 1
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static int loop_waiting = 0; /* write_loop() waits on qcond */
static int kicked = 0;       /* write_loop() must return to Python */
#define QLOCK() pthread_mutex_lock(&qlock)
#define QUNLOCK() pthread_mutex_unlock(&qlock)
#else
#include <process.h>
#define CURRENT_PID() ((long long)_getpid())
#define QLOCK() ((void)0)
#define QUNLOCK() ((void)0)
#endif
static Py_ssize_t batch_size = 16384; /* wake the writer at this many */
static Py_ssize_t buf_limit = 1048576;
static int drop_full = 0;
static long long ndropped = 0;
/* Counted drops; with a shared-memory ring also in its header, so the drainer can
   write them when this process dies without finalizing. */
#define COUNT_DROP(k) do { ndropped += (k); if (shm) shm->dropped = ndropped; } while (0)
static int woken = 0;
static unsigned long long next_id_val = 1;
static unsigned long long sticky_gen = 1;

static void free_chunks(chunk_t *c) {
    while (c) {
        chunk_t *nx = c->next;
        PyMem_RawFree(c->arena);
        PyMem_RawFree(c);
        c = nx;
    }
}

/* Drained chunks are kept for reuse (up to SPARE_MAX, 16 MiB): a new chunk's pages
   are then already mapped, and recording takes no page faults. Under qlock. */
#define SPARE_MAX 64
static chunk_t *spare = NULL;
static int nspare = 0;

static void recycle_chunks(chunk_t *c) {
    chunk_t *unused = NULL;
    QLOCK();
    while (c) {
        chunk_t *nx = c->next;
        if (nspare < SPARE_MAX) {
            c->next = spare;
            spare = c;
            nspare++;
        } else {
            c->next = unused;
            unused = c;
        }
        c = nx;
    }
    QUNLOCK();
    free_chunks(unused);
}

/* A chunk from the spare list or a new one; called under qlock. */
static chunk_t *new_chunk(void) {
    chunk_t *c = spare;
    if (c) {
        spare = c->next;
        nspare--;
    } else {
        c = PyMem_RawMalloc(sizeof(chunk_t));
        if (!c)
            return NULL;
        c->acap = 0;
        c->arena = NULL;
    }
    c->next = NULL;
    c->n = 0;
    c->alen = 0;
    return c;
}


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

#define SHM_SLOT_BYTES ((sizeof(shm_slot_t) + 4095) & ~(size_t)4095)
typedef char shm_header_fits[sizeof(shm_hdr_t) <= SHM_HEADER_BYTES ? 1 : -1];

static shm_hdr_t *shm = NULL;    /* attached: records go to the ring */
static char *shm_base = NULL;
static shm_slot_t *shm_cur = NULL; /* the FILLING slot */
static int shm_kinds_full = 0;
static int shm_sealed = 0;        /* a slot was sealed since the last wake */
/* 1 while captures run beside the ring: records go to process memory, and the
   writer relays their lines to the ring (shm_append_line) as it hands them on. */
static int shm_local = 0;
/* Spans in the ring not yet freed by the drainer, as last counted, plus those
   appended since: buffer_limit bounds the exact count (shm_held). */
static Py_ssize_t shm_est = 0;
static Py_buffer shm_view;
static int shm_has_view = 0;
/* This process's own copy of the ring's layout and positions (the region's copy is
   for the drainer and is never read back). */
static uint32_t shm_nslots = 0;
static uint64_t shm_next_seq = 0, shm_kinds_len = 0;
static uint32_t shm_nkinds = 0;
static uint32_t shm_cur_n = 0, shm_cur_alen = 0; /* records and arena bytes of shm_cur */
static long long shm_owner = 0; /* the pid that attached: a forked child never writes */
/* What a line is encoded with (as the drainer does), for a record too long for one
   slot: it goes into the ring as an encoded line, in pieces. */
static char *shm_pidp = NULL, *shm_hhp = NULL;
static Py_ssize_t shm_npid = 0, shm_nhh = 0;
static long long shm_offset = 0, shm_min_id = 0;

static inline shm_slot_t *slot_in(char *base, size_t slots_off, size_t slot_size, uint32_t i) {
    return (shm_slot_t *)(base + slots_off + (size_t)i * slot_size);
}

#define OWN_SLOT(i) slot_in(shm_base, SHM_HEADER_BYTES + SHM_KINDS_BYTES, SHM_SLOT_BYTES, (i))

static void shm_add_kind(const char *p, Py_ssize_t n) {
    if (!shm || shm_kinds_full)
        return;
    size_t need = 4 + (((size_t)n + 3) & ~(size_t)3);
    if (shm_kinds_len + need > SHM_KINDS_BYTES) {
        shm_kinds_full = 1; /* later kinds are written with name "?" */
        return;
    }
    char *e = shm_base + SHM_HEADER_BYTES + shm_kinds_len;
    uint32_t len = (uint32_t)n;
    memcpy(e, &len, 4);
    memcpy(e + 4, p, (size_t)n);
    shm_kinds_len += need;
    shm->kinds_len = shm_kinds_len;
    __atomic_store_n(&shm->nkinds, ++shm_nkinds, __ATOMIC_RELEASE);
}

static void shm_seal(void) {
    if (shm_cur) {
        __atomic_store_n(&shm_cur->state, SLOT_FULL, __ATOMIC_RELEASE);
        shm_cur = NULL;
        shm_sealed = 1;
    }
}

/* Stop recording into the ring without touching it (a child created by fork()
   holds a copy of the parent's mapping: the ring stays the parent's). The view is
   released later, by shm_detach, where the GIL is held. */
static void shm_forget_ring(void) {
    shm = NULL;
    shm_cur = NULL;
    shm_sealed = 0;
    shm_local = 0;
    shm_est = 0;
}

/* A slot's `reserved[0]` (the producer's own word, never read by a reader): how many
   of its records are lines encoded already (metadata, relayed lines), not spans. */
#define SLOT_RAW(s) ((s)->reserved[0])

/* The spans in slots the drainer has not freed yet (written or not: they are in
   memory until their slot is free): what buffer_limit bounds with a ring. */
static Py_ssize_t shm_held(void) {
    Py_ssize_t h = 0;
    for (uint32_t i = 0; i < shm_nslots; i++) {
        shm_slot_t *s = OWN_SLOT(i);
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_FREE)
            h += (Py_ssize_t)__atomic_load_n(&s->n, __ATOMIC_ACQUIRE) - (Py_ssize_t)SLOT_RAW(s);
    }
    return h;
}

/* At buffer_limit spans in the ring (counted again only when the estimate says so). */
static int shm_at_limit(void) {
    if (shm_est < buf_limit)
        return 0;
    shm_est = shm_held();
    return shm_est >= buf_limit;
}

#ifdef HAVE_WRITE_LOOP
/* fork() from C runs no Python at-fork hook, but it runs these. */
static void shm_after_fork_child(void) { shm_forget_ring(); }
static int shm_atfork_registered = 0;
#endif

/* The lowest FREE slot (few slots stay in use, so few pages are touched). */
static shm_slot_t *shm_take(void) {
    if (CURRENT_PID() != shm_owner) { /* a forked child that no hook told */
        shm_forget_ring();
        return NULL;
    }
    for (uint32_t i = 0; i < shm_nslots; i++) {
        shm_slot_t *s = OWN_SLOT(i);
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_FREE) {
            __atomic_store_n(&s->n, 0, __ATOMIC_RELAXED);
            s->alen = 0;
            SLOT_RAW(s) = 0;
            s->seq = shm_next_seq++;
            shm->next_seq = shm_next_seq;
            shm_cur_n = 0;
            shm_cur_alen = 0;
            __atomic_store_n(&s->state, SLOT_FILLING, __ATOMIC_RELEASE);
            return s;
        }
    }
    return NULL;
}

static char *encode_recs(char *o, const rec_t *recs, uint32_t from, uint32_t to,
                         const char *arena, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                         Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                         long long min_id);
#define REC_FIXED 240 /* literals and seven numbers of at most 20 digits, per line */
/* Most slots one line may take: a reader collects at most READ_RANGES slots at once. */
#define SHM_LONG_SLOTS 63

/* A line too long for one slot's arena, in pieces of one slot each (F_RAW, all
   but the last F_MORE); every slot it needs is free before the first piece is
   written, so it is never left cut short by a full ring. A reader writes a line
   only once its last piece is committed. 0, -1 (longer than the ring can hold),
   -2 (not enough free slots now). A span's line (`span`) counts as one span, in
   its last piece's slot. */
static int shm_append_pieces(const char *line, size_t len, int span) {
    size_t k = (len + SHM_ARENA - 1) / SHM_ARENA;
    if (k > SHM_LONG_SLOTS || k + 1 > shm_nslots)
        return -1;
    shm_seal();
    size_t nfree = 0;
    for (uint32_t i = 0; i < shm_nslots; i++)
        nfree += __atomic_load_n(&OWN_SLOT(i)->state, __ATOMIC_ACQUIRE) == SLOT_FREE;
    if (nfree < k)
        return -2;
    for (size_t i = 0; i < k; i++) {
        size_t piece = len - i * SHM_ARENA < SHM_ARENA ? len - i * SHM_ARENA : SHM_ARENA;
        if (!(shm_cur = shm_take()))
            return -2; /* not this process's ring any more (a forked child) */
        rec_t *r = &shm_cur->recs[0];
        memset(r, 0, sizeof(*r));
        r->count = -1;
        r->alen = (uint32_t)piece;
        r->level_flags = (F_RAW | (i + 1 < k ? F_MORE : 0)) << LEVEL_BITS;
        memcpy(shm_cur->arena, line + i * SHM_ARENA, piece);
        SLOT_RAW(shm_cur) = span && i + 1 == k ? 0 : 1;
        shm_est += span && i + 1 == k;
        shm_cur_alen = (uint32_t)piece;
        shm_cur->alen = shm_cur_alen;
        __atomic_store_n(&shm_cur->n, ++shm_cur_n, __ATOMIC_RELEASE);
        shm_seal();
    }
    return 0;
}

/* A record whose args do not fit in one slot: encoded here, as the drainer would,
   and appended in pieces. */
static int shm_append_long(uint32_t kid, long long t0, long long t1, unsigned long long id,
                           unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                           uint32_t flags, long long count, const char *a, Py_ssize_t na,
                           const char *b, Py_ssize_t nb) {
    size_t need = (size_t)(na + nb);
    if (need > (size_t)SHM_LONG_SLOTS * SHM_ARENA || need > UINT32_MAX)
        return -1;
    if ((flags & F_RAW) && !nb)
        return shm_append_pieces(a, need, 0);
    char *args = PyMem_RawMalloc(need ? need : 1);
    size_t cap = REC_FIXED + (size_t)max_kind_len + (size_t)shm_npid + (size_t)shm_nhh + need;
    char *line = PyMem_RawMalloc(cap);
    int rc = -1;
    if (args && line) {
        memcpy(args, a, (size_t)na);
        if (nb)
            memcpy(args + na, b, (size_t)nb);
        rec_t r = {.t0 = t0, .t1 = t1, .id = id, .parent = p, .kind = kid,
                   .level_flags = ((uint32_t)lvl & LEVEL_MASK) | (flags << LEVEL_BITS),
                   .tid = tid, .count = count, .aoff = 0, .alen = (uint32_t)need};
        char *end = encode_recs(line, &r, 0, 1, args, kinds, nkinds, shm_pidp, shm_npid,
                                shm_hhp, shm_nhh, shm_offset, shm_min_id);
        rc = end == line ? 0 : shm_append_pieces(line, (size_t)(end - line), 1);
    }
    PyMem_RawFree(args);
    PyMem_RawFree(line);
    return rc;
}

/* Append to the ring: 0, -1 (too long for the ring: dropped), -2 (ring full, or
   no longer this process's ring). */
static int shm_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                      unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                      uint32_t flags, long long count, const char *a, Py_ssize_t na,
                      const char *b, Py_ssize_t nb) {
    size_t need = (size_t)(na + nb);
    if (need > SHM_ARENA)
        return shm_append_long(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    if (shm_cur && (shm_cur_n == CHUNK_RECS || shm_cur_alen + need > SHM_ARENA))
        shm_seal();
    if (!shm_cur && !(shm_cur = shm_take()))
        return -2;
    shm_slot_t *c = shm_cur;
    rec_t *r = &c->recs[shm_cur_n];
    r->aoff = shm_cur_alen;
    r->alen = (uint32_t)need;
    if (na)
        memcpy(c->arena + shm_cur_alen, a, (size_t)na);
    if (nb)
        memcpy(c->arena + shm_cur_alen + na, b, (size_t)nb);
    shm_cur_alen += (uint32_t)need;
    c->alen = shm_cur_alen;
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
        shm_est++;
    __atomic_store_n(&c->n, ++shm_cur_n, __ATOMIC_RELEASE);
    return 0;
}

static void shm_release(void) {
    shm_forget_ring();
    shm_base = NULL;
    shm_nslots = 0;
    if (shm_has_view) {
        shm_has_view = 0;
        PyBuffer_Release(&shm_view);
    }
}


/* A copy of a bytes piece (replacing *dst). */
static int keep_piece(char **dst, Py_ssize_t *ndst, const char *src, Py_ssize_t n) {
    char *c = PyMem_RawMalloc((size_t)(n ? n : 1));
    if (!c) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(c, src, (size_t)n);
    PyMem_RawFree(*dst);
    *dst = c;
    *ndst = n;
    return 0;
}

/* shm_attach(buffer, pid, pid_piece, hh_piece, offset_ns, min_id): record into this
   writable region from now on (the pieces and numbers are the encoder's, for lines
   too long for one slot). */
static PyObject *shm_attach(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long pid, off, min_id;
    const char *pidp, *hhp;
    Py_ssize_t npid, nhh;
    if (!PyArg_ParseTuple(args, "OLy#y#LL", &obj, &pid, &pidp, &npid, &hhp, &nhh, &off, &min_id))
        return NULL;
    if (keep_piece(&shm_pidp, &shm_npid, pidp, npid) < 0 ||
        keep_piece(&shm_hhp, &shm_nhh, hhp, nhh) < 0)
        return NULL;
    shm_offset = off;
    shm_min_id = min_id;
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE) < 0)
        return NULL;
    size_t fixed = SHM_HEADER_BYTES + SHM_KINDS_BYTES;
    if ((size_t)v.len < fixed + 2 * SHM_SLOT_BYTES ||
        ((size_t)v.len - fixed) / SHM_SLOT_BYTES > UINT32_MAX) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "shared-memory region too small or too large");
        return NULL;
    }
#ifdef HAVE_WRITE_LOOP
    if (!shm_atfork_registered) {
        pthread_atfork(NULL, NULL, shm_after_fork_child);
        shm_atfork_registered = 1;
    }
#endif
    shm_release();
    shm_view = v;
    shm_has_view = 1;
    shm_base = (char *)v.buf;
    shm_hdr_t *h = (shm_hdr_t *)shm_base;
    memset(h, 0, sizeof(*h));
    shm_nslots = (uint32_t)(((size_t)v.len - fixed) / SHM_SLOT_BYTES);
    shm_next_seq = 0;
    shm_kinds_len = 0;
    shm_nkinds = 0;
    shm_owner = pid;
    h->version = SHM_VERSION;
    h->kinds_off = SHM_HEADER_BYTES;
    h->kinds_cap = SHM_KINDS_BYTES;
    h->slots_off = fixed;
    h->slot_size = SHM_SLOT_BYTES;
    h->nslots = shm_nslots;
    h->producer_pid = pid;
    h->dropped = ndropped;
    shm_kinds_full = 0;
    shm = h;
    for (Py_ssize_t k = 0; k < nkinds; k++)
        shm_add_kind(kinds[k].piece, kinds[k].n);
    /* what the in-process buffer held is not this session's */
    QLOCK();
    chunk_t *old = head;
    head = tail = NULL;
    full_recs = 0;
    __atomic_store_n(&taken, appended, __ATOMIC_RELAXED);
    QUNLOCK();
    free_chunks(old);
    __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* shm_detach(): record into process memory again (a forked child's copy of the
   region belongs to its parent and is never written). */
static PyObject *shm_detach(PyObject *self, PyObject *unused) {
    shm_release();
    Py_RETURN_NONE;
}

/* shm_local(on) -> before: with `on`, record into process memory while the ring stays
   attached (captures run: the writer hands the lines to them and relays them to the
   ring with shm_append_line); without, into the ring again. */
static PyObject *shm_set_local(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int before = shm_local;
    shm_local = shm ? on : 0;
    return PyBool_FromLong(before);
}

/* shm_seal_now(): seal the slot being filled, so the drainer can write it whole and
   free it (a producer waiting for room). */
static PyObject *shm_seal_now(PyObject *self, PyObject *unused) {
    if (shm)
        shm_seal();
    Py_RETURN_NONE;
}

/* shm_finish(): seal the slot being filled and mark the ring finalized. */
static PyObject *shm_finish(PyObject *self, PyObject *unused) {
    if (shm) {
        shm_seal();
        __atomic_store_n(&shm->finalized, 1u, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
}

/* shm_state() -> (free slots, slots, drainer_busy_ns, commits) or None when not
   attached; commits counts the drainer's commits (its progress). */
static PyObject *shm_state(PyObject *self, PyObject *unused) {
    if (!shm)
        Py_RETURN_NONE;
    uint32_t nfree = 0;
    for (uint32_t i = 0; i < shm_nslots; i++)
        nfree += __atomic_load_n(&OWN_SLOT(i)->state, __ATOMIC_ACQUIRE) == SLOT_FREE;
    return Py_BuildValue("(IILK)", nfree, shm_nslots,
                         (long long)__atomic_load_n(&shm->drainer_busy_ns, __ATOMIC_ACQUIRE),
                         (unsigned long long)__atomic_load_n(&shm->commit_gen, __ATOMIC_ACQUIRE));
}

static int make_room(void);

/* shm_append_line(line): one line encoded already (metadata, counters, instants,
   the trailer's lines), in order with the spans. False when it was dropped. */
static PyObject *shm_append_line(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "shm_append_line() takes bytes");
        return NULL;
    }
    if (!shm)
        Py_RETURN_FALSE;
    const char *s = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    int rc = shm_append(0, 0, 0, 0, 0, 0, 0, F_RAW, -1, s, n, NULL, 0);
    if (rc == -2) {
        if (make_room() < 0)
            return NULL;
        rc = shm ? shm_append(0, 0, 0, 0, 0, 0, 0, F_RAW, -1, s, n, NULL, 0) : -1;
    }
    if (rc < 0) {
        COUNT_DROP(1);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Append one record; -1 when memory ran out (the caller counts it as dropped). */
static int native_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                         unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                         uint32_t flags, long long count, const char *a, Py_ssize_t na,
                         const char *b, Py_ssize_t nb) {
    if (shm && !shm_local)
        return shm_append(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    chunk_t *c = tail;
    if (!c || c->n == CHUNK_RECS) {
        QLOCK();
        c = new_chunk();
        if (c) {
            if (tail) {
                tail->next = c;
                full_recs += tail->n;
            } else {
                head = c;
            }
            tail = c;
#ifdef HAVE_WRITE_LOOP
            if (loop_waiting && full_recs >= batch_size)
                pthread_cond_signal(&qcond);
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
    appended++;
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

static recstate_t R = {0};
static PyObject *update_slow = NULL; /* Node._update_py */
static PyObject *str_thread_stk, *str_stk, *str_on, *str_kid, *str_ikid, *str_bkid, *str_tid,
    *str_open, *str_extra, *str_node, *str_frag, *str_mask, *str_sgen, *str_sticky, *str__args,
    *str__obj, *str__token;

/* The __slots__ of dftrace's own small Python classes (Extra, Span), read and set
   in place: each slot's offset is found once from its member descriptor. For an
   instance of another class (a subclass), or where none was found (off -1),
   attribute access is used. */
typedef struct {
    PyTypeObject *type; /* borrowed: R or H holds it */
    PyObject *name;
    Py_ssize_t off;
} slot_t;
static slot_t slot_frag, slot_mask, slot_args, slot_obj, slot_token;

static void find_slot(slot_t *s, PyObject *type, PyObject *name) {
    s->type = PyType_Check(type) ? (PyTypeObject *)type : NULL;
    s->name = name;
    s->off = -1;
    PyObject *d = s->type ? PyDict_GetItemWithError(s->type->tp_dict, name) : NULL;
    if (d && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            s->off = m->offset;
    }
    PyErr_Clear();
}

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
#ifdef _MSC_VER
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif
static THREAD_LOCAL stack_cache_t stack_cache;
static unsigned long long stack_epoch = 1;
static int stack_cache_ok = 0;

static inline int cache_valid(void) {
    return stack_cache.stk && stack_cache.epoch == stack_epoch &&
           stack_cache.tsid == PyThreadState_GetID(PyThreadState_Get());
}

/* New reference to LOCAL.stk (None: ask resolve()); NULL with an error. */
static PyObject *local_stk(void) {
    if (cache_valid()) {
        Py_INCREF(stack_cache.stk);
        return stack_cache.stk;
    }
    PyObject *stk = PyObject_GetAttr(R.local, str_stk);
    if (!stk || !stack_cache_ok || !PyList_Check(stk))
        return stk;
    PyObject *tid = PyObject_GetAttr(stk, str_tid), *open = tid ? PyObject_GetAttr(stk, str_open) : NULL;
    if (open && PyDict_Check(open)) {
        stack_cache.stk = stk;
        stack_cache.tid = tid;
        stack_cache.open = open;
        stack_cache.epoch = stack_epoch;
        stack_cache.tsid = PyThreadState_GetID(PyThreadState_Get());
    }
    PyErr_Clear();
    Py_XDECREF(tid);
    Py_XDECREF(open);
    return stk;
}

/* New references to a stack's tid / open map. */
static PyObject *stk_tid(PyObject *stk) {
    if (stk == stack_cache.stk && cache_valid()) {
        Py_INCREF(stack_cache.tid);
        return stack_cache.tid;
    }
    return PyObject_GetAttr(stk, str_tid);
}

static PyObject *stk_open(PyObject *stk) {
    if (stk == stack_cache.stk && cache_valid()) {
        Py_INCREF(stack_cache.open);
        return stack_cache.open;
    }
    return PyObject_GetAttr(stk, str_open);
}

/* stacks_changed(): a LOCAL.stk was assigned (or LOCAL replaced). */
static PyObject *stacks_changed(PyObject *self, PyObject *unused) {
    stack_epoch++;
    Py_RETURN_NONE;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    recstate_t r;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOO", &r.local, &r.resolve, &r.wait_room, &r.wake,
                          &r.unwind, &r.with_error, &r.merge, &r.to_extra, &r.sticky_of,
                          &r.extra_type, &r.slow_exit))
        return NULL;
    PyObject **nw = (PyObject **)&r, **old = (PyObject **)&R;
    for (size_t k = 0; k < sizeof(recstate_t) / sizeof(PyObject *); k++) {
        Py_INCREF(nw[k]);
        Py_XDECREF(old[k]);
    }
    R = r;
    /* the stack cache needs LOCAL to be per thread: a real threading.local */
    PyObject *thread = PyImport_ImportModule("_thread");
    PyObject *local_type = thread ? PyObject_GetAttrString(thread, "_local") : NULL;
    int real = local_type ? PyObject_IsInstance(R.local, local_type) : -1;
    Py_XDECREF(local_type);
    Py_XDECREF(thread);
    if (real < 0)
        PyErr_Clear();
    stack_cache_ok = real == 1;
    stack_epoch++;
    find_slot(&slot_frag, R.extra_type, str_frag);
    find_slot(&slot_mask, R.extra_type, str_mask);
    find_slot(&slot_args, R.extra_type, str__args);
    Py_RETURN_NONE;
}

/* buffer_limit spans wait: in process memory, or in the ring (see shm_held). */
#define AT_LIMIT() (shm && !shm_local ? shm_at_limit() : nbuf >= buf_limit)

/* Called when the buffer is at its limit: in block mode wait for the writer (a
   KeyboardInterrupt/SystemExit raised while waiting propagates: -1), else count. */
static int make_room(void) {
    if (!drop_full && R.wait_room) {
        PyObject *r = PyObject_CallNoArgs(R.wait_room);
        if (!r) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return -1;
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    return 0;
}

/* A batch is ready: wake the writer once per batch, and again every 4096 records
   while it has not drained (its wake() makes a producer wait when the writer has
   fallen a flush interval behind). */
static void wake_writer(void) {
    if (!R.wake || (woken && (nbuf & 0xFFF)))
        return;
    woken = 1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallNoArgs(R.wake);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* The fragment bytes and key mask of an Extra (or None). Borrowed pointers into the
   Extra's bytes: valid while the caller holds it. */
static int extra_piece(PyObject *x, const char **s, Py_ssize_t *n, unsigned long long *mask) {
    *s = NULL;
    *n = 0;
    *mask = 0;
    if (x == NULL || x == Py_None)
        return 0;
    PyObject *f = slot_get(x, &slot_frag);
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
    PyObject *m = slot_get(x, &slot_mask);
    if (!m)
        return -1;
    *mask = PyLong_AsUnsignedLongLongMask(m);
    Py_DECREF(m);
    if (*mask == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return 0;
}

static int get_ull(PyObject *o, unsigned long long *out) {
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
#else
#define unlikely(x) (x)
#endif

/* Off, a span pays one predictable branch on this flag: NVTX_OPEN / NVTX_CLOSE. */
static int nvtx_on = 0;
static PyObject *nvtx_open_fn = NULL, *nvtx_close_fn = NULL; /* open_range, close_range */

/* Call an NVTX hook; an exception set before stays as it was, one it raises is dropped. */
static void nvtx_call(PyObject *fn, PyObject *const *args, size_t n) {
    if (fn == NULL)
        return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_INCREF(fn); /* set_nvtx() on another thread may drop it meanwhile */
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    Py_DECREF(fn);
    if (r)
        Py_DECREF(r);
    else
        PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* Span `id` of kind `kid` opened on `stk`; `pairs`: it closes after the spans opened
   inside it (every span the C engine opens), so it can push a range. */
static void nvtx_open(uint32_t kid, PyObject *id, PyObject *stk, int pairs) {
    PyObject *k = PyLong_FromUnsignedLong(kid);
    if (!k) {
        PyErr_Clear();
        return;
    }
    nvtx_call(nvtx_open_fn, (PyObject *const[]){k, id, stk, pairs ? Py_True : Py_False}, 4);
    Py_DECREF(k);
}

/* Span `id` closed (recorded, or ended without a record). */
static void nvtx_close(PyObject *id) { nvtx_call(nvtx_close_fn, &id, 1); }

#define NVTX_OPEN(kid, id, stk, pairs) \
    do { if (unlikely(nvtx_on)) nvtx_open((kid), (id), (stk), (pairs)); } while (0)
#define NVTX_CLOSE(id) \
    do { if (unlikely(nvtx_on)) nvtx_close(id); } while (0)

/* set_nvtx(open_range, close_range), or set_nvtx(None, None) to stop. */
static PyObject *set_nvtx(PyObject *self, PyObject *args) {
    PyObject *o, *c;
    if (!PyArg_ParseTuple(args, "OO", &o, &c))
        return NULL;
    int on = (o != Py_None && c != Py_None);
    if (on && (!PyCallable_Check(o) || !PyCallable_Check(c))) {
        PyErr_SetString(PyExc_TypeError, "set_nvtx() takes two callables, or None and None");
        return NULL;
    }
    nvtx_on = 0;
    Py_CLEAR(nvtx_open_fn);
    Py_CLEAR(nvtx_close_fn);
    if (on) {
        Py_INCREF(o);
        Py_INCREF(c);
        nvtx_open_fn = o;
        nvtx_close_fn = c;
        nvtx_on = 1;
    }
    Py_RETURN_NONE;
}

/* The recording primitive. Returns 0 (recorded, or dropped and counted) or -1 with
   an exception that must reach the caller (a signal's exception during back-pressure).
   Any other failure is swallowed and counted: recording never breaks the program. */
static int emit_span(uint32_t kid, long long t0, long long t1, PyObject *id, PyObject *p,
                     Py_ssize_t lvl, PyObject *tid, PyObject *sticky, PyObject *x,
                     long long count, uint32_t flags) {
    NVTX_CLOSE(id);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* an exception the span is closing over stays as it is */
    int rc = 0;
    PyObject *own = NULL, *merged = NULL;
    if (AT_LIMIT()) {
        if (make_room() < 0) {
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
    unsigned long long ma, mb, iv, pv, tv;
    if (x != NULL && x != Py_None && Py_TYPE(x) != (PyTypeObject *)R.extra_type) {
        own = PyObject_CallOneArg(R.to_extra, x);
        if (!own)
            goto fail;
        x = own;
    }
    if (extra_piece(sticky, &a, &na, &ma) < 0 || extra_piece(x, &b, &nb, &mb) < 0)
        goto fail;
    if (ma & mb) {
        /* maybe a key in both: the span's own args win; let Python merge them */
        merged = PyObject_CallFunctionObjArgs(R.merge, sticky, x, NULL);
        if (!merged || extra_piece(merged, &b, &nb, &mb) < 0)
            goto fail;
        a = NULL;
        na = 0;
    }
    if (get_ull(id, &iv) < 0 || get_ull(p, &pv) < 0 || get_ull(tid, &tv) < 0)
        goto fail;
    int ar = native_append(kid, t0, t1, iv, pv, lvl, tv, flags, count, a, na, b, nb);
    if (ar == -2) { /* the shared ring is full: as at the buffer limit */
        if (make_room() < 0) {
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
    if (shm_sealed) { /* a slot of the ring is full: tell the drainer */
        shm_sealed = 0;
        woken = 0;
        wake_writer();
    } else if (nbuf >= batch_size)
        wake_writer();
    goto done;
fail:
    PyErr_Clear();
    COUNT_DROP(1);
done:
    Py_XDECREF(own);
    Py_XDECREF(merged);
    PyErr_Restore(et, ev, tb);
    return rc;
}

/* record(kid, t0, t1, id, parent, level, tid, sticky=None, extra=None, count=-1, flags=0) */
static PyObject *record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 7 || nargs > 11) {
        PyErr_SetString(PyExc_TypeError, "record() takes 7 to 11 arguments");
        return NULL;
    }
    long kid = PyLong_AsLong(args[0]);
    long long t0 = PyLong_AsLongLong(args[1]), t1 = PyLong_AsLongLong(args[2]);
    Py_ssize_t lvl = PyLong_AsSsize_t(args[5]);
    long long count = nargs > 9 ? PyLong_AsLongLong(args[9]) : -1;
    long flags = nargs > 10 ? PyLong_AsLong(args[10]) : 0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        COUNT_DROP(1);
        Py_RETURN_NONE;
    }
    if (emit_span((uint32_t)kid, t0, t1, args[3], args[4], lvl, args[6],
                  nargs > 7 ? args[7] : Py_None, nargs > 8 ? args[8] : Py_None, count,
                  (uint32_t)flags) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------- */
/* args: the fragment of a small flat dict of plain keys and JSON scalars      */

static Py_ssize_t max_arg_len = 1024;
static int off_for_good = 0;

static PyObject *set_options(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    int off;
    if (!PyArg_ParseTuple(args, "np", &n, &off))
        return NULL;
    max_arg_len = n;
    off_for_good = off;
    Py_RETURN_NONE;
}

/* An ASCII str that JSON writes as it is (no escapes), at most max_arg_len long. */
static const char *plain_str(PyObject *o, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(o) || !PyUnicode_IS_ASCII(o))
        return NULL;
    Py_ssize_t len = PyUnicode_GET_LENGTH(o);
    if (len > max_arg_len)
        return NULL;
    const unsigned char *c = PyUnicode_1BYTE_DATA(o);
    for (Py_ssize_t k = 0; k < len; k++)
        if (c[k] < 0x20 || c[k] == '"' || c[k] == '\\')
            return NULL;
    *n = len;
    return (const char *)c;
}

static int is_reserved(const char *k, Py_ssize_t n) {
    return (n == 5 && (!memcmp(k, "hhash", 5) || !memcmp(k, "level", 5))) ||
           (n == 5 && !memcmp(k, "p_idx", 5));
}

/* Values JSON writes as they are: None, bools, 64-bit ints, finite floats, plain
   strings, and lists/tuples/dicts of those (at most 32 items, three levels deep:
   what sanitize_args keeps as it is). -1: not plain (Python sanitizes it). */
#define PLAIN_MAX_ITEMS 32
#define PLAIN_MAX_DEPTH 3

typedef struct {
    char *o, *end;
    int nested; /* a container was written */
} pbuf;

static int pb_room(pbuf *b, Py_ssize_t n) { return b->end - b->o >= n; }

static int put_plain(pbuf *b, PyObject *v, int depth) {
    if (!pb_room(b, 32))
        return -1;
    if (v == Py_None) {
        b->o = put(b->o, LIT("null"));
    } else if (v == Py_True) {
        b->o = put(b->o, LIT("true"));
    } else if (v == Py_False) {
        b->o = put(b->o, LIT("false"));
    } else if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return -1;
            }
            b->o = put_uint(b->o, u);
        } else if (overflow < 0 || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        } else {
            b->o = put_int(b->o, x);
        }
    } else if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (x - x != 0)
            return -1; /* NaN or infinity: sanitize writes them as strings */
        char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!r) {
            PyErr_Clear();
            return -1;
        }
        Py_ssize_t n = (Py_ssize_t)strlen(r);
        if (!pb_room(b, n)) {
            PyMem_Free(r);
            return -1;
        }
        b->o = put(b->o, r, n);
        PyMem_Free(r);
    } else if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *vs = plain_str(v, &n);
        if (!vs || !pb_room(b, n + 2))
            return -1;
        *b->o++ = '"';
        b->o = put(b->o, vs, n);
        *b->o++ = '"';
    } else if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (depth >= PLAIN_MAX_DEPTH || n > PLAIN_MAX_ITEMS)
            return -1;
        b->nested = 1;
        *b->o++ = '[';
        for (Py_ssize_t k = 0; k < n; k++) {
            if (k)
                *b->o++ = ',';
            if (put_plain(b, PySequence_Fast_GET_ITEM(v, k), depth + 1) < 0 || !pb_room(b, 2))
                return -1;
        }
        *b->o++ = ']';
    } else if (PyDict_CheckExact(v)) {
        if (depth >= PLAIN_MAX_DEPTH || PyDict_GET_SIZE(v) > PLAIN_MAX_ITEMS)
            return -1;
        b->nested = 1;
        *b->o++ = '{';
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        int first = 1;
        while (PyDict_Next(v, &pos, &k, &x)) {
            Py_ssize_t nk;
            const char *ks = plain_str(k, &nk);
            if (!ks || !pb_room(b, nk + 8))
                return -1;
            if (!first)
                *b->o++ = ',';
            first = 0;
            *b->o++ = '"';
            b->o = put(b->o, ks, nk);
            *b->o++ = '"';
            *b->o++ = ':';
            if (put_plain(b, x, depth + 1) < 0 || !pb_room(b, 2))
                return -1;
        }
        *b->o++ = '}';
    } else {
        return -1;
    }
    return 0;
}

/* (frag, mask) for a plain dict; NULL without an error when it is not plain.
   *nested tells whether it held containers (their copy is then not a snapshot). */
static PyObject *plain_fragment_of(PyObject *d, unsigned long long *mask_out, int *nested) {
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) > PLAIN_MAX_ITEMS)
        return NULL;
    char buf[16384];
    pbuf b = {buf, buf + sizeof(buf), 0};
    unsigned long long mask = 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        Py_ssize_t nk;
        const char *ks = plain_str(k, &nk);
        if (!ks || is_reserved(ks, nk) || !pb_room(&b, nk + 8))
            return NULL;
        Py_hash_t h = PyObject_Hash(k);
        if (h == -1) {
            PyErr_Clear();
            return NULL;
        }
        mask |= 1ULL << ((unsigned long long)h & 63);
        *b.o++ = ',';
        *b.o++ = '"';
        b.o = put(b.o, ks, nk);
        *b.o++ = '"';
        *b.o++ = ':';
        if (put_plain(&b, v, 0) < 0)
            return NULL;
    }
    *mask_out = mask;
    *nested = b.nested;
    return PyBytes_FromStringAndSize(buf, b.o - buf);
}

/* An Extra for a plain dict (its copy, fragment and mask); NULL without an error
   when the dict is not plain. */
static PyObject *str_args_attr;
static PyObject *plain_extra(PyObject *d) {
    unsigned long long mask = 0;
    int nested = 0;
    PyObject *frag = plain_fragment_of(d, &mask, &nested);
    if (!frag)
        return NULL;
    PyTypeObject *t = (PyTypeObject *)R.extra_type;
    PyObject *x = t ? t->tp_alloc(t, 0) : NULL;
    /* a flat dict's copy is a snapshot; with containers, args are decoded from
       the fragment when asked for (None here) */
    PyObject *copy = x ? (nested ? Py_NewRef(Py_None) : PyDict_Copy(d)) : NULL;
    PyObject *m = copy ? PyLong_FromUnsignedLongLong(mask) : NULL;
    if (!m || slot_set(x, &slot_args, copy) < 0 || slot_set(x, &slot_frag, frag) < 0 ||
        slot_set(x, &slot_mask, m) < 0) {
        Py_XDECREF(x);
        x = NULL;
    }
    Py_XDECREF(m);
    Py_XDECREF(copy);
    Py_DECREF(frag);
    return x;
}

/* plain_fragment(d) -> (frag, mask) or None */
static PyObject *plain_fragment_py(PyObject *self, PyObject *d) {
    unsigned long long mask = 0;
    int nested = 0;
    PyObject *frag = plain_fragment_of(d, &mask, &nested);
    if (!frag) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NKO)", frag, mask, nested ? Py_True : Py_False);
}

/* The JSON lines of records [from, to) of a chunk whose args are in `arena`; the
   one encoder of both the in-process writer and the drainer. */
static char *encode_recs(char *o, const rec_t *recs, uint32_t from, uint32_t to,
                         const char *arena, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                         Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                         long long min_id) {
    for (uint32_t k = from; k < to; k++) {
        const rec_t *r = &recs[k];
        if ((r->level_flags >> LEVEL_BITS) & F_RAW) {
            o = put(o, arena + r->aoff, r->alen);
            continue;
        }
        if ((long long)r->id <= min_id)
            continue;
        long long ts = (r->t0 + off) / 1000;
        long long dur = (r->t1 + off) / 1000 - ts;
        o = put(o, LIT("{\"id\":"));
        o = put_uint(o, r->id);
        if (r->kind < nk)
            o = put(o, ks[r->kind].piece, ks[r->kind].n);
        else
            o = put(o, LIT(",\"name\":\"?\",\"cat\":\"dftrace\""));
        o = put(o, pidp, npid);
        o = put_uint(o, r->tid);
        o = put(o, LIT(",\"ts\":"));
        o = put_int(o, ts);
        o = put(o, LIT(",\"dur\":"));
        o = put_int(o, dur);
        o = put(o, hhp, nhh);
        o = put_uint(o, r->level_flags & LEVEL_MASK);
        o = put(o, LIT(",\"p_idx\":"));
        o = put_uint(o, r->parent);
        if (r->alen)
            o = put(o, arena + r->aoff, r->alen);
        if (r->count >= 0) {
            o = put(o, LIT(",\"count\":"));
            o = put_int(o, r->count);
        }
        if ((r->level_flags >> LEVEL_BITS) & F_INCOMPLETE)
            o = put(o, LIT(",\"incomplete\":true"));
        o = put(o, LIT("}}\n"));
    }
    return o;
}

/* Detach up to maxn records (whole chunks; at least one chunk) from the front of the
   buffer. GIL held. Returns the first chunk (NULL: nothing buffered), the records
   taken and an upper bound of their encoded size. */
static chunk_t *detach(Py_ssize_t maxn, Py_ssize_t extra_per_rec, Py_ssize_t *ntaken,
                       size_t *upper) {
    QLOCK();
    chunk_t *first = head, *last = NULL;
    Py_ssize_t n = 0;
    size_t up = 0;
    while (head && (n == 0 || n + (Py_ssize_t)head->n <= maxn)) {
        last = head;
        n += head->n;
        if (head != tail)
            full_recs -= head->n;
        up += (size_t)head->n * (size_t)(REC_FIXED + max_kind_len + extra_per_rec) + head->alen;
        head = head->next;
    }
    *ntaken = n;
    *upper = up;
    if (last) {
        last->next = NULL;
        if (!head)
            tail = NULL;
        __atomic_store_n(&taken, taken + (unsigned long long)n, __ATOMIC_RELAXED);
    }
    QUNLOCK();
    if (!last)
        return NULL;
    woken = 0;
    return first;
}

/* The JSON lines of the records of the chunks from `c` on, written at `o`; returns
   the end. Runs without the GIL: it reads only the chunks (detached, the caller's
   own) and the kind table (never freed). */
static char *encode_chunks(chunk_t *c, char *o, const kind_t *ks, Py_ssize_t nk,
                           const char *pidp, Py_ssize_t npid, const char *hhp,
                           Py_ssize_t nhh, long long off, long long min_id) {
    for (; c; c = c->next)
        o = encode_recs(o, c->recs, 0, c->n, c->arena, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    return o;
}

/* drain(max_records, pid_piece, hh_piece, offset_ns, min_id) -> (bytes, n) */
static PyObject *drain(PyObject *self, PyObject *args) {
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "ny#y#LL", &maxn, &pidp, &npid, &hhp, &nhh, &off, &min_id))
        return NULL;
    Py_ssize_t n;
    size_t upper;
    chunk_t *first = detach(maxn, npid + nhh, &n, &upper);
    if (!first)
        return Py_BuildValue("(y#n)", "", (Py_ssize_t)0, (Py_ssize_t)0);
    kind_t *ks = kinds;
    Py_ssize_t nk = nkinds;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)upper);
    if (!out) {
        free_chunks(first);
        COUNT_DROP(n);
        return NULL;
    }
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    Py_BEGIN_ALLOW_THREADS
    o = encode_chunks(first, o0, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    Py_END_ALLOW_THREADS
    recycle_chunks(first);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - o0)) < 0)
        return NULL;
    PyObject *res = Py_BuildValue("(Nn)", out, n);
    return res;
}

/* ------------------------------------------------------------------------- */
/* One frame straight to the file: encode, compress and write with the GIL
   released once. zstd comes from the system's libzstd, loaded at first use (its
   one-shot API, stable since zstd 1.0); without it the writer compresses in
   Python, taking the GIL between the steps.                                 */

typedef size_t (*zstd_compress_fn)(void *, void *, size_t, const void *, size_t, int);
typedef size_t (*zstd_bound_fn)(size_t);
typedef unsigned (*zstd_iserror_fn)(size_t);
typedef void *(*zstd_create_fn)(void);
static struct {
    int tried;
    void *cctx;
    zstd_compress_fn compress;
    zstd_bound_fn bound;
    zstd_iserror_fn iserror;
} zstd;

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#define HAVE_NATIVE_WRITE 1
static int load_zstd(void) {
    if (zstd.tried)
        return zstd.cctx != NULL;
    zstd.tried = 1;
    static const char *names[] = {"libzstd.so.1", "libzstd.1.dylib", "libzstd.so", "libzstd.dylib"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        zstd_create_fn create = (zstd_create_fn)dlsym(h, "ZSTD_createCCtx");
        zstd.compress = (zstd_compress_fn)dlsym(h, "ZSTD_compressCCtx");
        zstd.bound = (zstd_bound_fn)dlsym(h, "ZSTD_compressBound");
        zstd.iserror = (zstd_iserror_fn)dlsym(h, "ZSTD_isError");
        if (create && zstd.compress && zstd.bound && zstd.iserror && (zstd.cctx = create()))
            return 1;
        dlclose(h); /* an incomplete library: not used */
    }
    return 0;
}

/* gzip members from the system's libdeflate (deflate-compatible, faster than zlib),
   loaded at first use; without it the writer compresses gzip in Python. A `level`
   of GZIP_LEVEL_BASE + n asks for gzip at libdeflate's level n (1..12). */
#define GZIP_LEVEL_BASE 100
typedef void *(*deflate_alloc_fn)(int);
typedef size_t (*deflate_gzip_fn)(void *, const void *, size_t, void *, size_t);
typedef size_t (*deflate_bound_fn)(void *, size_t);
static struct {
    int tried;
    deflate_alloc_fn alloc;
    deflate_gzip_fn gzip;
    deflate_bound_fn bound;
    void *by_level[13];
} gz;

/* The system's libdeflate, opened once (NULL without it). */
static void *libdeflate(void) {
    static int tried = 0;
    static void *handle = NULL;
    if (tried)
        return handle;
    tried = 1;
    static const char *names[] = {"libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.so",
                                  "libdeflate.dylib"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !handle; i++)
        handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    return handle;
}

static int load_gzip(void) {
    if (gz.tried)
        return gz.gzip != NULL;
    gz.tried = 1;
    void *h = libdeflate();
    if (!h)
        return 0;
    gz.alloc = (deflate_alloc_fn)dlsym(h, "libdeflate_alloc_compressor");
    gz.gzip = (deflate_gzip_fn)dlsym(h, "libdeflate_gzip_compress");
    gz.bound = (deflate_bound_fn)dlsym(h, "libdeflate_gzip_compress_bound");
    if (!(gz.alloc && gz.gzip && gz.bound))
        gz.gzip = NULL; /* an incomplete library: not used */
    return gz.gzip != NULL;
}

/* gzip decoding from the same library (libdeflate_gzip_decompress_ex decodes one
   whole member into a buffer large enough for it): the analysis's fast inflate. */
typedef void *(*inflate_alloc_fn)(void);
typedef void (*inflate_free_fn)(void *);
typedef int (*gunzip_ex_fn)(void *, const void *, size_t, void *, size_t, size_t *, size_t *);
static struct {
    int tried;
    inflate_alloc_fn alloc;
    inflate_free_fn release;
    gunzip_ex_fn gunzip;
} gunz;

static int load_gunzip(void) {
    if (gunz.tried)
        return gunz.gunzip != NULL;
    gunz.tried = 1;
    void *h = libdeflate();
    if (!h)
        return 0;
    gunz.alloc = (inflate_alloc_fn)dlsym(h, "libdeflate_alloc_decompressor");
    gunz.release = (inflate_free_fn)dlsym(h, "libdeflate_free_decompressor");
    gunz.gunzip = (gunzip_ex_fn)dlsym(h, "libdeflate_gzip_decompress_ex");
    if (!(gunz.alloc && gunz.release && gunz.gunzip))
        gunz.gunzip = NULL;
    return gunz.gunzip != NULL;
}
#else
static int load_zstd(void) { return 0; }
static int load_gzip(void) { return 0; }
static int load_gunzip(void) { return 0; }
#endif

/* gunzip_members(data, start, limit) -> (decoded, consumed), or None without
   libdeflate: the whole gzip members of data[start:] decoded one after the other,
   without the GIL, until about `limit` bytes came out. Stops early, returning what
   it has, at a member that does not decode whole here (cut by the end of `data`,
   longer than the room left, damaged): the caller's streaming decoder takes that
   one, and tells a cut from damage. */
static PyObject *gunzip_members(PyObject *self, PyObject *args) {
#ifndef HAVE_NATIVE_WRITE
    Py_RETURN_NONE;
#else
    Py_buffer in;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "y*nn", &in, &start, &limit))
        return NULL;
    if (!load_gunzip() || limit <= 0 || start < 0 || start > in.len) {
        PyBuffer_Release(&in);
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, limit);
    void *d = out ? gunz.alloc() : NULL;
    if (!d) {
        Py_XDECREF(out);
        PyBuffer_Release(&in);
        return out ? PyErr_NoMemory() : NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    const char *src = (const char *)in.buf;
    size_t pos = (size_t)start, used = 0, n = (size_t)in.len, room = (size_t)limit;
    Py_BEGIN_ALLOW_THREADS
    while (pos < n && used < room) {
        size_t in_used = 0, out_used = 0;
        /* 0: LIBDEFLATE_SUCCESS */
        if (gunz.gunzip(d, src + pos, n - pos, dst + used, room - used, &in_used, &out_used) != 0)
            break;
        pos += in_used;
        used += out_used;
    }
    Py_END_ALLOW_THREADS
    gunz.release(d);
    PyBuffer_Release(&in);
    if (_PyBytes_Resize(&out, (Py_ssize_t)used) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, (Py_ssize_t)(pos - (size_t)start));
#endif
}

/* native_write() -> the compressions drain_write() can do ("none", "zstd", "gzip") */
static PyObject *native_write(PyObject *self, PyObject *unused) {
#ifdef HAVE_NATIVE_WRITE
    return Py_BuildValue("(sss)", "none", load_zstd() ? "zstd" : "none",
                         load_gzip() ? "gzip" : "none");
#else
    return PyTuple_New(0);
#endif
}

#ifdef HAVE_NATIVE_WRITE
/* Buffers kept between frames (only the writer thread drains, one frame at a
   time): their pages stay mapped, so a frame takes no page faults. */
static char *enc_buf = NULL, *zbuf = NULL;
static size_t enc_cap = 0, zcap = 0;
static Py_ssize_t inflight = 0; /* records in the drain_write() under way */

static int ensure(char **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    char *b = PyMem_RawRealloc(*buf, need);
    if (!b)
        return -1;
    *buf = b;
    *cap = need;
    return 0;
}

/* `len` bytes of lines as one frame (zstd at `level`; < 0: as they are) appended to
   fd, the compressed bytes in *zb (grown as needed). No GIL. Returns 0 or an errno;
   *written: bytes that reached the file. */
static int compress_write(int fd, int level, const char *src, size_t len, char **zb,
                          size_t *zcap_, size_t *written) {
    *written = 0;
    if (!len)
        return 0;
    if (level >= GZIP_LEVEL_BASE) {
        int n = level - GZIP_LEVEL_BASE;
        n = n < 1 ? 1 : n > 12 ? 12 : n;
        if (!gz.gzip)
            return EINVAL;
        if (!gz.by_level[n] && !(gz.by_level[n] = gz.alloc(n)))
            return ENOMEM;
        size_t bound = gz.bound(gz.by_level[n], len);
        if (ensure(zb, zcap_, bound) < 0)
            return ENOMEM;
        size_t z = gz.gzip(gz.by_level[n], src, len, *zb, bound);
        if (!z)
            return EIO;
        src = *zb;
        len = z;
    } else if (level >= 0) {
        size_t bound = zstd.bound(len);
        if (ensure(zb, zcap_, bound) < 0)
            return ENOMEM;
        size_t z = zstd.compress(zstd.cctx, *zb, bound, src, len, level);
        if (zstd.iserror(z))
            return EIO;
        src = *zb;
        len = z;
    }
    while (*written < len) {
        ssize_t w = write(fd, src + *written, len - *written);
        if (w < 0) {
            if (errno != EINTR)
                return errno;
        } else {
            *written += (size_t)w;
        }
    }
    return 0;
}

/* One frame: the records of chunks [c, end) (and `pre` first), encoded, compressed
   and written. No GIL. Returns 0 or an errno; *written: bytes that reached the file. */
static int write_frame(int fd, int level, chunk_t *c, chunk_t *end, const char *pre,
                       Py_ssize_t npre, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                       Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                       long long min_id, size_t *written) {
    size_t upper = (size_t)npre + 1;
    for (chunk_t *k = c; k != end; k = k->next)
        upper += (size_t)k->n * (size_t)(REC_FIXED + max_kind_len + npid + nhh) + k->alen;
    *written = 0;
    if (ensure(&enc_buf, &enc_cap, upper) < 0)
        return ENOMEM;
    memcpy(enc_buf, pre, (size_t)npre);
    char *o = enc_buf + npre;
    if (c != end) {
        /* encode_chunks stops at the end of the list: cut it there for the call */
        chunk_t *last = c;
        while (last->next != end)
            last = last->next;
        last->next = NULL;
        o = encode_chunks(c, o, ks, nk, pidp, npid, hhp, nhh, off, min_id);
        last->next = end;
    }
    return compress_write(fd, level, enc_buf, (size_t)(o - enc_buf), &zbuf, &zcap, written);
}

/* Frames this process's engine wrote whole, ever: what a finishing writer's progress
   is read by (a long write_frames call moves it frame by frame). */
static long long frames_written_total = 0;

/* The chunks from `c` on as frames of at most `frame` records (`pre` opens the
   first), each encoded, compressed and written; stops at the first error. No GIL.
   *done, *bytes: the records and bytes of the frames written whole. */
static int write_frames(int fd, int level, chunk_t *c, Py_ssize_t frame, const char *pre,
                        Py_ssize_t npre, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                        Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                        long long min_id, Py_ssize_t *done, Py_ssize_t *bytes) {
    int err = 0, first = 1;
    while (!err && (c || (first && npre))) {
        chunk_t *end = c;
        Py_ssize_t recs = 0;
        while (end && (recs == 0 || recs + (Py_ssize_t)end->n <= frame)) {
            recs += end->n;
            end = end->next;
        }
        size_t w = 0;
        err = write_frame(fd, level, c, end, pre, first ? npre : 0, ks, nk, pidp, npid, hhp,
                          nhh, off, min_id, &w);
        if (!err) {
            *done += recs;
            *bytes += (Py_ssize_t)w;
            __atomic_add_fetch(&frames_written_total, 1, __ATOMIC_RELAXED);
        }
        first = 0;
        c = end;
    }
    return err;
}

/* drain_write(fd, level, frame_records, max_records, pid_piece, hh_piece, offset_ns,
               min_id, prefix) -> (records taken, records written, bytes written, errno, st_nlink)
   Takes up to max_records (whole chunks) with the GIL held, then, with the GIL
   released once, writes them as frames of at most frame_records records each
   (one zstd frame apiece; level < 0: no compression), `prefix` (lines already
   encoded: metadata records) first. On a failed write it stops: the records and
   bytes written count only whole frames (the caller cuts the file back to them;
   the rest of what was taken is lost and counted by the caller). */
static PyObject *drain_write(PyObject *self, PyObject *args) {
    int fd, level;
    Py_ssize_t frame, maxn, npid, nhh, npre;
    const char *pidp, *hhp, *pre;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "iinny#y#LLy#", &fd, &level, &frame, &maxn, &pidp, &npid, &hhp,
                          &nhh, &off, &min_id, &pre, &npre))
        return NULL;
    if (level >= 0 && !load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    Py_ssize_t n;
    size_t upper;
    chunk_t *first = detach(maxn, 0, &n, &upper);
    if (!first && !npre)
        return Py_BuildValue("(nnnii)", (Py_ssize_t)0, (Py_ssize_t)0, (Py_ssize_t)0, 0, -1);
    kind_t *ks = kinds;
    Py_ssize_t nk = nkinds;
    int err = 0;
    long nlink = -1;
    Py_ssize_t done = 0, bytes = 0;
    int room = SPARE_MAX - nspare; /* chunks the spare list can take back */
    inflight = n;
    chunk_t *keep = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = write_frames(fd, level, first, frame, pre, npre, ks, nk, pidp, npid, hhp, nhh, off,
                       min_id, &done, &bytes);
    if (!err) {
        struct stat st;
        if (fstat(fd, &st) == 0)
            nlink = (long)st.st_nlink;
    }
    /* free what the spare list can't take here, not with the GIL held */
    keep = first;
    chunk_t *prev = NULL, *k = first;
    for (int i = 0; k && i < room; i++) {
        prev = k;
        k = k->next;
    }
    if (prev)
        prev->next = NULL;
    else
        keep = NULL;
    free_chunks(k);
    Py_END_ALLOW_THREADS
    inflight = 0;
    recycle_chunks(keep);
    return Py_BuildValue("(nnnil)", n, done, bytes, err, nlink);
}
#endif

#ifdef HAVE_WRITE_LOOP
static long long writing_since_ns = 0; /* start of the loop's write under way, 0: none */

/* The full chunks (all before the tail), taken under qlock; NULL: none. */
static chunk_t *take_full(Py_ssize_t *n) {
    *n = 0;
    if (!head || head == tail)
        return NULL;
    chunk_t *first = head, *last = head;
    Py_ssize_t k = head->n;
    while (last->next != tail) {
        last = last->next;
        k += last->n;
    }
    last->next = NULL;
    head = tail;
    full_recs = 0;
    __atomic_store_n(&taken, taken + (unsigned long long)k, __ATOMIC_RELAXED);
    *n = k;
    return first;
}

/* write_loop(fd, level, frame_records, seconds, max_bytes, pid_piece, hh_piece,
              offset_ns, min_id) -> (records taken, written, bytes written, errno, st_nlink)
   The writer thread's wait, without the GIL: whenever a batch of full chunks is
   buffered, take them (producers go on filling the tail chunk) and write them as
   frames; return after `seconds`, when kick() is called, when the file has
   max_bytes more (0: no limit; rotation is the caller's), or on an error. The GIL
   is taken again only to return: once per flush interval, not per frame. */
static PyObject *write_loop(PyObject *self, PyObject *args) {
    int fd, level;
    Py_ssize_t frame, npid, nhh, max_bytes;
    double seconds;
    const char *pidp, *hhp;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "iindny#y#LL", &fd, &level, &frame, &seconds, &max_bytes, &pidp,
                          &npid, &hhp, &nhh, &off, &min_id))
        return NULL;
    if (level >= 0 && !load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    kind_t *ks = kinds;
    Py_ssize_t nk = nkinds;
    Py_ssize_t all = 0, done = 0, bytes = 0;
    int err = 0;
    long nlink = -1;
    long long deadline = now_ns() + (long long)(seconds * 1e9);
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        QLOCK();
        Py_ssize_t n = 0;
        chunk_t *first = NULL;
        while (!kicked) {
            if (full_recs >= batch_size) {
                first = take_full(&n);
                break;
            }
            long long now = now_ns();
            if (now >= deadline)
                break;
            /* qcond uses the realtime clock: wait a relative slice of at most 50 ms */
            long long slice = deadline - now < 50000000LL ? deadline - now : 50000000LL;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(slice % 1000000000LL);
            ts.tv_sec += (time_t)(slice / 1000000000LL) + ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            loop_waiting = 1;
            pthread_cond_timedwait(&qcond, &qlock, &ts);
            loop_waiting = 0;
        }
        QUNLOCK();
        if (!first)
            break;
        all += n;
        inflight = n;
        __atomic_store_n(&writing_since_ns, now_ns(), __ATOMIC_RELAXED);
        err = write_frames(fd, level, first, frame, "", 0, ks, nk, pidp, npid, hhp, nhh, off,
                           min_id, &done, &bytes);
        __atomic_store_n(&writing_since_ns, 0, __ATOMIC_RELAXED);
        inflight = 0;
        recycle_chunks(first);
        if (err || (max_bytes && bytes >= max_bytes))
            break;
    }
    if (!err && done) {
        struct stat st;
        if (fstat(fd, &st) == 0)
            nlink = (long)st.st_nlink;
    }
    QLOCK();
    kicked = 0;
    QUNLOCK();
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(nnnil)", all, done, bytes, err, nlink);
}

/* kick(): make write_loop() return now (a flush, a sync or the end is asked for). */
static PyObject *kick(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    QLOCK();
    kicked = 1;
    pthread_cond_signal(&qcond);
    QUNLOCK();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* frames_written() -> frames the engine has written whole in this process, ever. */
static PyObject *frames_written(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(__atomic_load_n(&frames_written_total, __ATOMIC_RELAXED));
}

/* writing_since() -> CLOCK_MONOTONIC seconds when write_loop's write under way
   began, 0.0 when none (storage that hangs shows here) */
static PyObject *writing_since(PyObject *self, PyObject *unused) {
    long long t = __atomic_load_n(&writing_since_ns, __ATOMIC_RELAXED);
    return PyFloat_FromDouble(t ? (double)t / 1e9 : 0.0);
}
#endif

/* in_flight() -> records taken by a drain_write() that has not returned (a write
   stuck on storage) */
static PyObject *in_flight(PyObject *self, PyObject *unused) {
#ifdef HAVE_NATIVE_WRITE
    return PyLong_FromSsize_t(inflight);
#else
    return PyLong_FromLong(0);
#endif
}

/* ------------------------------------------------------------------------- */
/* ShmReader: the drainer's side of one producer's ring                      */
/*
 * The producer can write the region at any time, so the reader checks the layout
 * once (at attach) and keeps it; it copies the records it encodes into its own
 * memory and checks each (args inside the slot's arena, a known kind), so that
 * nothing the producer writes later makes it read or write out of bounds. A ring
 * found inconsistent raises RingError: the drainer drops that producer.
 */

static PyObject *RingError = NULL;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    shm_hdr_t *h;
    char *base;
    /* the layout, read and checked once */
    uint32_t nslots;
    size_t slots_off, slot_size, kinds_off, kinds_cap;
    uint64_t next_seq; /* the slot to encode next ... */
    uint32_t pos;      /* ... from this record on */
    uint64_t done_seq; /* the position of the last commit */
    uint32_t done_pos;
    kind_t *ks;
    Py_ssize_t nk, capk, maxk;
    uint64_t koff;
    rec_t *recs;  /* the records being encoded, copied out of the ring */
    size_t crecs; /* their capacity */
    char *buf, *zb; /* drain_write's lines and compressed frame, kept between calls */
    size_t cap, zcap;
} ShmReader;

static void ShmReader_release(ShmReader *self) {
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
    self->h = NULL;
    self->base = NULL;
}

static void ShmReader_dealloc(ShmReader *self) {
    ShmReader_release(self);
    PyMem_Free(self->ks);
    PyMem_RawFree(self->recs);
    PyMem_RawFree(self->buf);
    PyMem_RawFree(self->zb);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline shm_slot_t *reader_slot(ShmReader *self, uint32_t i) {
    return slot_in(self->base, self->slots_off, self->slot_size, i);
}

/* The latest commit, copied (NULL when none was made). */
static int reader_commit_of(ShmReader *self, shm_commit_t *out) {
    uint64_t gen = __atomic_load_n(&self->h->commit_gen, __ATOMIC_ACQUIRE);
    if (!gen)
        return 0;
    memcpy(out, &self->h->commit[gen & 1], sizeof(*out));
    return out->valid == 1;
}

/* Slots whose every record was written: FREE for the producer. */
static void reader_free_before(ShmReader *self, uint64_t seq) {
    for (uint32_t i = 0; i < self->nslots; i++) {
        shm_slot_t *c = reader_slot(self, i);
        if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == SLOT_FULL && c->seq < seq)
            __atomic_store_n(&c->state, SLOT_FREE, __ATOMIC_RELEASE);
    }
}

static int ShmReader_init(ShmReader *self, PyObject *args, PyObject *kw) {
    PyObject *obj;
    int resume = 0;
    if (!PyArg_ParseTuple(args, "O|p", &obj, &resume))
        return -1;
    ShmReader_release(self);
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    shm_hdr_t *h = (shm_hdr_t *)self->view.buf;
    size_t len = (size_t)self->view.len;
    if (len < SHM_HEADER_BYTES || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC ||
        h->version != SHM_VERSION) {
        ShmReader_release(self);
        PyErr_SetString(RingError, "not a dftrace ring (or another version)");
        return -1;
    }
    /* One read of each field: the checks and the use see the same values. */
    uint64_t nslots = h->nslots, slot_size = h->slot_size, slots_off = h->slots_off;
    uint64_t kinds_off = h->kinds_off, kinds_cap = h->kinds_cap;
    if (slot_size < sizeof(shm_slot_t) || slot_size % 8 || slots_off % 8 || kinds_off % 4 ||
        kinds_off < sizeof(shm_hdr_t) || kinds_cap > len || kinds_off > len - kinds_cap ||
        kinds_off + kinds_cap > slots_off || slots_off > len || nslots == 0 ||
        nslots > (len - slots_off) / slot_size) {
        ShmReader_release(self);
        PyErr_SetString(RingError, "the ring's layout does not fit its region");
        return -1;
    }
    self->h = h;
    self->base = (char *)h;
    self->nslots = (uint32_t)nslots;
    self->slot_size = (size_t)slot_size;
    self->slots_off = (size_t)slots_off;
    self->kinds_off = (size_t)kinds_off;
    self->kinds_cap = (size_t)kinds_cap;
    self->next_seq = 0;
    self->pos = 0;
    if (resume) { /* go on from the last commit: what was written before it stays */
        shm_commit_t c;
        if (reader_commit_of(self, &c)) {
            self->next_seq = c.seq;
            self->pos = c.pos;
        }
        reader_free_before(self, self->next_seq);
    }
    self->done_seq = self->next_seq;
    self->done_pos = self->pos;
    self->nk = 0;
    self->maxk = 0;
    self->koff = 0;
    return 0;
}

/* Kind pieces committed since the last call (they stay where they are: a producer
   rewriting one changes its own lines' text, never their length). */
static int reader_kinds(ShmReader *self) {
    shm_hdr_t *h = self->h;
    uint32_t n = __atomic_load_n(&h->nkinds, __ATOMIC_ACQUIRE);
    const char *area = self->base + self->kinds_off;
    while ((uint32_t)self->nk < n) {
        if (self->nk == self->capk) {
            Py_ssize_t cap = self->capk ? self->capk * 2 : 256;
            kind_t *g = PyMem_Realloc(self->ks, sizeof(kind_t) * (size_t)cap);
            if (!g) {
                PyErr_NoMemory();
                return -1;
            }
            self->ks = g;
            self->capk = cap;
        }
        uint32_t len;
        if (self->koff + 4 > self->kinds_cap)
            break;
        memcpy(&len, area + self->koff, 4);
        if (self->koff + 4 + (uint64_t)len > self->kinds_cap)
            break;
        self->ks[self->nk].piece = (char *)area + self->koff + 4;
        self->ks[self->nk].n = len;
        if ((Py_ssize_t)len > self->maxk)
            self->maxk = len;
        self->koff += 4 + (((uint64_t)len + 3) & ~(uint64_t)3);
        self->nk++;
    }
    return 0;
}

#define READ_RANGES 64
typedef struct {
    shm_slot_t *s;
    const rec_t *recs; /* the range's records, copied (index 0 is record `from`) */
    uint32_t from, to;
} range_t;

/* The ranges of records to encode next, in sequence order: the sealed slots (and,
   with `partial`, the records committed so far in the slot being filled), at most
   about maxn records, copied into the reader's memory and checked; their count
   and an upper bound of their encoded size. -1 with RingError (or MemoryError). */
static int collect_ranges(ShmReader *self, Py_ssize_t maxn, size_t per, int partial,
                          range_t *rg, Py_ssize_t *n_out, size_t *upper_out, uint64_t *seq_out,
                          uint32_t *pos_out) {
    int nr = 0;
    Py_ssize_t n = 0;
    size_t upper = 0;
    uint64_t seq = self->next_seq;
    uint32_t pos = self->pos;
    size_t need = (size_t)(maxn > 0 ? maxn : 1) + CHUNK_RECS;
    if (self->crecs < need) {
        rec_t *g = PyMem_RawRealloc(self->recs, need * sizeof(rec_t));
        if (!g) {
            PyErr_NoMemory();
            return -1;
        }
        self->recs = g;
        self->crecs = need;
    }
    size_t used = 0;
    typedef struct {
        int open, range;
        uint32_t k;
        uint64_t seq;
        uint32_t pos;
        Py_ssize_t n;
        size_t upper;
    } group_t;
    group_t g = {0, 0, 0, 0, 0, 0, 0};
    while (nr < READ_RANGES && (n == 0 || n < maxn)) {
        shm_slot_t *s = NULL;
        for (uint32_t i = 0; i < self->nslots; i++) {
            shm_slot_t *c = reader_slot(self, i);
            if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != SLOT_FREE &&
                __atomic_load_n(&c->seq, __ATOMIC_RELAXED) == seq) {
                s = c;
                break;
            }
        }
        if (!s)
            break;
        int full = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_FULL;
        uint32_t cnt = __atomic_load_n(&s->n, __ATOMIC_ACQUIRE);
        if (cnt > CHUNK_RECS) {
            PyErr_SetString(RingError, "a slot of the ring claims more records than it holds");
            return -1;
        }
        if (!full && !partial)
            break;
        if (pos > cnt)
            pos = cnt;
        uint32_t take = cnt - pos;
        rec_t *copy = self->recs + used;
        memcpy(copy, &s->recs[pos], (size_t)take * sizeof(rec_t));
        for (uint32_t k = 0; k < take; k++) {
            const rec_t *r = &copy[k];
            if ((size_t)r->aoff + r->alen > SHM_ARENA) {
                PyErr_SetString(RingError, "a record of the ring points outside its slot");
                return -1;
            }
            if ((r->level_flags >> LEVEL_BITS) & F_MORE) {
                if (!g.open) /* a line in pieces begins: where to stop if it is not whole */
                    g = (group_t){1, nr, k, seq, pos + k, n + k, upper};
            } else {
                g.open = 0;
            }
            upper += per + r->alen;
        }
        rg[nr].s = s;
        rg[nr].recs = copy;
        rg[nr].from = pos;
        rg[nr].to = cnt;
        used += take;
        n += take;
        nr++;
        if (!full) {
            pos = cnt;
            break;
        }
        seq++;
        pos = 0;
    }
    if (g.open) { /* the last line is not whole yet: stop before its first piece */
        nr = g.k ? g.range + 1 : g.range;
        if (g.k)
            rg[g.range].to = rg[g.range].from + g.k;
        n = g.n;
        upper = g.upper;
        seq = g.seq;
        pos = g.pos;
    }
    *n_out = n;
    *upper_out = upper;
    *seq_out = seq;
    *pos_out = pos;
    return nr;
}

/* Encode the ranges at o (no GIL). */
static char *encode_ranges(char *o, range_t *rg, int nr, const kind_t *ks, Py_ssize_t nk,
                           const char *pidp, Py_ssize_t npid, const char *hhp, Py_ssize_t nhh,
                           long long off, long long min_id) {
    for (int k = 0; k < nr; k++)
        o = encode_recs(o, rg[k].recs, 0, rg[k].to - rg[k].from, rg[k].s->arena, ks, nk, pidp,
                        npid, hhp, nhh, off, min_id);
    return o;
}

/* Ready to read: the ring is attached and its kind table read. -1 with an error. */
static int reader_ready(ShmReader *self) {
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return -1;
    }
    return reader_kinds(self);
}

/* The ranges up to (seq, pos) were encoded; they are freed at the next commit. */
static void reader_advance(ShmReader *self, uint64_t seq, uint32_t pos) {
    self->next_seq = seq;
    self->pos = pos;
}

static PyObject *ShmReader_drain(ShmReader *self, PyObject *args) {
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    int partial;
    if (!PyArg_ParseTuple(args, "ny#y#LLp", &maxn, &pidp, &npid, &hhp, &nhh, &off, &min_id,
                          &partial))
        return NULL;
    if (reader_ready(self) < 0)
        return NULL;
    range_t rg[READ_RANGES];
    Py_ssize_t n;
    size_t upper;
    uint64_t seq;
    uint32_t pos;
    int nr = collect_ranges(self, maxn, (size_t)(REC_FIXED + self->maxk + npid + nhh), partial,
                            rg, &n, &upper, &seq, &pos);
    if (nr < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)upper);
    if (!out)
        return NULL;
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    kind_t *ks = self->ks;
    Py_ssize_t nk = self->nk;
    Py_BEGIN_ALLOW_THREADS
    o = encode_ranges(o0, rg, nr, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    Py_END_ALLOW_THREADS
    reader_advance(self, seq, pos);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(o - o0)) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, n);
}

#ifdef HAVE_NATIVE_WRITE
/* drain_write(fd, level, max_records, pid_piece, hh_piece, offset_ns, min_id, partial)
   -> (records, bytes written, errno, st_nlink): as drain(), then the lines are
   compressed (level < 0: not) and appended to fd as one frame, without the GIL:
   the drainer writes the way the writer thread does. */
static PyObject *ShmReader_drain_write(ShmReader *self, PyObject *args) {
    int fd, level, partial;
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "iiny#y#LLp", &fd, &level, &maxn, &pidp, &npid, &hhp, &nhh, &off,
                          &min_id, &partial))
        return NULL;
    if (reader_ready(self) < 0)
        return NULL;
    if (level >= 0 && !load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    range_t rg[READ_RANGES];
    Py_ssize_t n;
    size_t upper;
    uint64_t seq;
    uint32_t pos;
    int nr = collect_ranges(self, maxn, (size_t)(REC_FIXED + self->maxk + npid + nhh), partial,
                            rg, &n, &upper, &seq, &pos);
    if (nr < 0)
        return NULL;
    if (ensure(&self->buf, &self->cap, upper + 1) < 0)
        return PyErr_NoMemory();
    kind_t *ks = self->ks;
    Py_ssize_t nk = self->nk;
    size_t written = 0;
    int err = 0;
    long nlink = -1;
    Py_BEGIN_ALLOW_THREADS
    char *o = encode_ranges(self->buf, rg, nr, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    err = compress_write(fd, level, self->buf, (size_t)(o - self->buf), &self->zb, &self->zcap,
                         &written);
    if (!err && written) {
        struct stat st;
        if (fstat(fd, &st) == 0)
            nlink = (long)st.st_nlink;
    }
    Py_END_ALLOW_THREADS
    reader_advance(self, seq, pos);
    return Py_BuildValue("(nnil)", n, (Py_ssize_t)written, err, nlink);
}
#endif

/* commit(run, part, size, advance=True): what was drained is in the file
   <base>[.run][.part<part>], whose first `size` bytes are whole frames (size < 0:
   no file of its own, a FIFO). Publishes where a successor goes on reading (without
   `advance`: where the last commit said, the file having changed), then frees the
   slots read through. */
static PyObject *ShmReader_commit(ShmReader *self, PyObject *args) {
    unsigned int run, part;
    long long size;
    int advance = 1;
    if (!PyArg_ParseTuple(args, "IIL|p", &run, &part, &size, &advance))
        return NULL;
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "closed");
        return NULL;
    }
    if (advance) {
        self->done_seq = self->next_seq;
        self->done_pos = self->pos;
    }
    shm_hdr_t *h = self->h;
    uint64_t gen = __atomic_load_n(&h->commit_gen, __ATOMIC_RELAXED) + 1;
    shm_commit_t *c = &h->commit[gen & 1];
    c->valid = 0;
    c->seq = self->done_seq;
    c->pos = self->done_pos;
    c->run = run;
    c->part = part;
    c->size = size < 0 ? NO_FILE : (uint64_t)size;
    c->valid = 1;
    __atomic_store_n(&h->commit_gen, gen, __ATOMIC_RELEASE);
    reader_free_before(self, self->done_seq);
    Py_RETURN_NONE;
}

/* committed -> (run, part, size) of the latest commit's file, or None. */
static PyObject *ShmReader_get_committed(ShmReader *self, void *unused) {
    shm_commit_t c;
    if (!self->h || !reader_commit_of(self, &c) || c.size == NO_FILE)
        Py_RETURN_NONE;
    return Py_BuildValue("(IIK)", c.run, c.part, (unsigned long long)c.size);
}

static PyObject *ShmReader_set_busy(ShmReader *self, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (self->h)
        __atomic_store_n(&self->h->drainer_busy_ns, (int64_t)v, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *ShmReader_close(ShmReader *self, PyObject *unused) {
    ShmReader_release(self);
    Py_RETURN_NONE;
}

static PyObject *ShmReader_get_finalized(ShmReader *self, void *c) {
    return PyBool_FromLong(self->h && __atomic_load_n(&self->h->finalized, __ATOMIC_ACQUIRE));
}

static PyObject *ShmReader_get_dropped(ShmReader *self, void *c) {
    long long d = self->h ? (long long)__atomic_load_n(&self->h->dropped, __ATOMIC_RELAXED) : 0;
    return PyLong_FromLongLong(d > 0 ? d : 0);
}

static PyObject *ShmReader_get_pid(ShmReader *self, void *c) {
    return PyLong_FromLongLong(self->h ? (long long)self->h->producer_pid : 0);
}

static PyMethodDef ShmReader_methods[] = {
    {"drain", (PyCFunction)ShmReader_drain, METH_VARARGS,
     "drain(max_records, pid_piece, hh_piece, offset_ns, min_id, partial) -> (bytes, n)"},
#ifdef HAVE_NATIVE_WRITE
    {"drain_write", (PyCFunction)ShmReader_drain_write, METH_VARARGS,
     "drain_write(fd, level, max_records, pid_piece, hh_piece, offset_ns, min_id, partial) "
     "-> (records, bytes written, errno, st_nlink): drain() compressed and appended to fd"},
#endif
    {"commit", (PyCFunction)ShmReader_commit, METH_VARARGS,
     "commit(run, part, size, advance=True): what was drained is written in that file"},
    {"set_busy", (PyCFunction)ShmReader_set_busy, METH_O,
     "set_busy(ns): when the write under way began (CLOCK_MONOTONIC), 0 when idle"},
    {"close", (PyCFunction)ShmReader_close, METH_NOARGS, "Let go of the region."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef ShmReader_getset[] = {
    {"finalized", (getter)ShmReader_get_finalized, NULL, "the producer finalized", NULL},
    {"dropped", (getter)ShmReader_get_dropped, NULL, "the producer's counted drops", NULL},
    {"pid", (getter)ShmReader_get_pid, NULL, "the producer's pid", NULL},
    {"committed", (getter)ShmReader_get_committed, NULL,
     "(run, part, size) of the latest commit, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ShmReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace._core._speedups.ShmReader",
    .tp_basicsize = sizeof(ShmReader),
    .tp_dealloc = (destructor)ShmReader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ShmReader(region, resume=False): read the records of one producer's "
              "shared-memory ring; drained records are freed for the producer at the next "
              "commit(), once written. With resume: from the last commit on.",
    .tp_methods = ShmReader_methods,
    .tp_getset = ShmReader_getset,
    .tp_init = (initproc)ShmReader_init,
    .tp_new = PyType_GenericNew,
};

/* Forget everything buffered. */
static PyObject *reset(PyObject *self, PyObject *unused) {
    QLOCK();
    chunk_t *c = head;
    head = tail = NULL;
    full_recs = 0;
    __atomic_store_n(&taken, appended, __ATOMIC_RELAXED);
    QUNLOCK();
    free_chunks(c);
    woken = 0;
    ndropped = 0;
    Py_RETURN_NONE;
}

/* In a forked child: the lock may have been copied held by a thread that does not
   exist here, and the lists half changed. Start afresh; the parent's chunks are
   left as they are (not freed: they may be inconsistent). */
static PyObject *after_fork(PyObject *self, PyObject *unused) {
#ifdef HAVE_WRITE_LOOP
    pthread_mutex_init(&qlock, NULL);
    pthread_cond_init(&qcond, NULL);
    loop_waiting = 0;
    kicked = 0;
#endif
    spare = NULL;
    nspare = 0;
    head = tail = NULL;
    full_recs = 0;
    __atomic_store_n(&taken, appended, __ATOMIC_RELAXED);
    woken = 0;
    stack_epoch++;
    Py_RETURN_NONE;
}

static PyObject *set_limits(PyObject *self, PyObject *args) {
    Py_ssize_t b, l;
    int d;
    if (!PyArg_ParseTuple(args, "nnp", &b, &l, &d))
        return NULL;
    batch_size = b;
    buf_limit = l;
    drop_full = d;
    Py_RETURN_NONE;
}

/* Spans waiting to be written: in process memory, and in the ring's slots not yet
   freed. */
static PyObject *buffered(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(nbuf + (shm ? shm_held() : 0));
}

static PyObject *get_dropped(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(ndropped); }

static PyObject *set_dropped(PyObject *self, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    ndropped = v;
    if (shm)
        shm->dropped = v;
    Py_RETURN_NONE;
}

static PyObject *new_id_py(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(next_id_val++);
}

static PyObject *bump_sticky_gen(PyObject *self, PyObject *unused) {
    sticky_gen++;
    Py_RETURN_NONE;
}

static PyObject *get_sticky_gen(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(sticky_gen);
}

static PyObject *clock_ns(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(now_ns()); }

/* ------------------------------------------------------------------------- */
/* nodes and uses: the fields the hot paths read, in the object itself         */

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
} TraceableObject;

static PyTypeObject TraceableBaseType;
static PyObject *gate_obj = NULL; /* GATE: what a use forced on follows */

#define AS_T(o) ((TraceableObject *)(o))
#define IS_T(o) PyObject_TypeCheck((o), &TraceableBaseType)

/* Whether `o` (a node, a use, or the GATE) records now; -1 with an error. */
static int is_on(PyObject *o) {
    if (IS_T(o)) {
        TraceableObject *t = AS_T(o);
        if (t->on)
            return t->on == Py_True;
        if (t->forced == NULL || t->forced == Py_None) {
            if (t->node && t->node != o && IS_T(t->node) && AS_T(t->node)->on)
                return AS_T(t->node)->on == Py_True;
        } else if (t->forced == Py_False) {
            return 0;
        } else if (gate_obj) {
            return is_on(gate_obj);
        }
    }
    PyObject *on = PyObject_GetAttr(o, str_on);
    if (!on)
        return -1;
    int r = PyObject_IsTrue(on);
    Py_DECREF(on);
    return r;
}

/* New references to a traceable's _node / _extra. */
static PyObject *get_node(PyObject *o) {
    if (IS_T(o) && AS_T(o)->node) {
        Py_INCREF(AS_T(o)->node);
        return AS_T(o)->node;
    }
    return PyObject_GetAttr(o, str_node);
}

/* A use made while its node was off encodes its args on first use. */
static PyObject *get_extra(PyObject *o) {
    if (!IS_T(o))
        return PyObject_GetAttr(o, str_extra);
    TraceableObject *t = AS_T(o);
    if (!t->extra && t->raw) {
        PyObject *x = PyObject_CallOneArg(R.to_extra, t->raw);
        if (!x)
            return NULL;
        t->extra = x;
        Py_CLEAR(t->raw);
    }
    PyObject *x = t->extra ? t->extra : Py_None;
    Py_INCREF(x);
    return x;
}

/* The sticky args of a node now: its parent's, then its own (new reference: an
   Extra or None). Refreshed once per update() generation; where no node of the
   chain has args of its own beyond one, no object is made at all. */
static PyObject *sticky_chain(TraceableObject *t) {
    if (t->sgen == sticky_gen) {
        PyObject *st = t->sticky ? t->sticky : Py_None;
        Py_INCREF(st);
        return st;
    }
    if (t->pending && PyDict_Check(t->pending) && PyDict_GET_SIZE(t->pending))
        return PyObject_CallOneArg(R.sticky_of, (PyObject *)t); /* encodes them first */
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
        st = PyObject_CallFunctionObjArgs(R.merge, base, own, NULL);
        Py_DECREF(base);
        if (!st)
            return NULL;
    }
    Py_INCREF(st);
    Py_XSETREF(t->sticky, st);
    t->sgen = sticky_gen;
    return st;
}

/* The sticky args of `node` now (new reference: an Extra or None). */
static PyObject *node_sticky(PyObject *node) {
    if (IS_T(node))
        return sticky_chain(AS_T(node));
    PyObject *g = PyObject_GetAttr(node, str_sgen);
    if (!g)
        return NULL;
    unsigned long long gv = PyLong_AsUnsignedLongLongMask(g);
    Py_DECREF(g);
    if (gv == sticky_gen)
        return PyObject_GetAttr(node, str_sticky);
    return PyObject_CallOneArg(R.sticky_of, node);
}

static uint32_t node_kid(PyObject *node, PyObject *name) {
    if (IS_T(node)) {
        TraceableObject *t = AS_T(node);
        return name == str_kid ? t->kid : name == str_ikid ? t->ikid : t->bkid;
    }
    PyObject *k = PyObject_GetAttr(node, name);
    long v = k ? PyLong_AsLong(k) : -1;
    Py_XDECREF(k);
    if (v < 0) {
        PyErr_Clear();
        return 0xFFFFFFFFu;
    }
    return (uint32_t)v;
}

static PyObject *new_id(void) { return PyLong_FromUnsignedLongLong(next_id_val++); }

/* Drop the top of a non-empty stack (a list keeps its allocation when it shrinks). */
static inline int drop_top(PyObject *stk) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    PyObject *top = PyList_GET_ITEM(stk, n - 1);
    Py_SET_SIZE(stk, n - 1);
    Py_DECREF(top);
    return 0;
}

/* Remove span `id` from the top of `stk`; anything left above it is unwound. */
static int stack_pop(PyObject *stk, PyObject *id) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (n > 0 && PyList_GET_ITEM(stk, n - 1) == id)
        return drop_top(stk);
    PyObject *r = PyObject_CallFunctionObjArgs(R.unwind, stk, id, NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* SpanWrapper: the decorator                                                 */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *node;
    PyObject *gate;
    PyObject *extra;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
    uint32_t kid;
} SpanWrapper;

static PyObject *SpanWrapper_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    SpanWrapper *w = (SpanWrapper *)self_;
    int on = is_on(w->gate);
    if (on < 0)
        return NULL;
    if (!on || R.local == NULL)
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);

    PyObject *stk = local_stk();
    if (!stk)
        return NULL;
    if (stk == Py_None) {
        Py_DECREF(stk);
        stk = PyObject_CallNoArgs(R.resolve);
        if (!stk)
            return NULL;
    }
    if (!PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_DECREF(stk);
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    PyObject *sticky = node_sticky(w->node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    PyObject *id = new_id();
    PyObject *tid = id ? stk_tid(stk) : NULL;
    if (!tid || PyList_Append(stk, id) < 0) {
        Py_XDECREF(tid);
        Py_XDECREF(id);
        Py_DECREF(sticky);
        Py_DECREF(stk);
        PyErr_Clear();
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk) - 1;
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    NVTX_OPEN(w->kid, id, stk, 1);
    long long t0 = now_ns();
    PyObject *result = PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    long long t1 = now_ns();
    if (!result) {
        /* record the span with args.error, then let the exception go on unchanged */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *x = ev ? PyObject_CallFunctionObjArgs(R.with_error, w->extra, ev, NULL) : NULL;
        if (!x) {
            PyErr_Clear();
            x = w->extra;
            Py_INCREF(x);
        }
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        if (emit_span(w->kid, t0, t1, id, p, lvl, tid, sticky, x, -1, 0) < 0) {
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
        } else {
            PyErr_Restore(et, ev, tb);
        }
        Py_DECREF(x);
    } else {
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        if (emit_span(w->kid, t0, t1, id, p, lvl, tid, sticky, w->extra, -1, 0) < 0)
            Py_CLEAR(result); /* a signal's exception while waiting for room */
    }
    Py_DECREF(sticky);
    Py_DECREF(tid);
    Py_DECREF(p);
    Py_DECREF(id);
    Py_DECREF(stk);
    return result;
}

static PyObject *SpanWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fn, *node, *gate, *extra;
    if (!PyArg_ParseTuple(args, "OOOO", &fn, &node, &gate, &extra))
        return NULL;
    uint32_t kid = node_kid(node, str_kid);
    SpanWrapper *w = (SpanWrapper *)type->tp_alloc(type, 0);
    if (!w)
        return NULL;
    Py_INCREF(fn); Py_INCREF(node); Py_INCREF(gate); Py_INCREF(extra);
    w->fn = fn;
    w->node = node;
    w->gate = gate;
    w->extra = extra;
    w->dict = NULL;
    w->weakreflist = NULL;
    w->vectorcall = SpanWrapper_vectorcall;
    w->kid = kid;
    return (PyObject *)w;
}

static int SpanWrapper_traverse(SpanWrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->fn);
    Py_VISIT(w->node);
    Py_VISIT(w->gate);
    Py_VISIT(w->extra);
    Py_VISIT(w->dict);
    return 0;
}

static int SpanWrapper_clear(SpanWrapper *w) {
    Py_CLEAR(w->fn);
    Py_CLEAR(w->node);
    Py_CLEAR(w->gate);
    Py_CLEAR(w->extra);
    Py_CLEAR(w->dict);
    return 0;
}

static void SpanWrapper_dealloc(SpanWrapper *w) {
    PyObject_GC_UnTrack(w);
    if (w->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)w);
    SpanWrapper_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Behave like a function when found on a class: bind to the instance. */
static PyObject *SpanWrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* Pickle by reference, like a function: the name under which the module holds us. */
static PyObject *SpanWrapper_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef SpanWrapper_methods[] = {
    {"__reduce__", SpanWrapper_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef SpanWrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

static PyTypeObject SpanWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanWrapper",
    .tp_basicsize = sizeof(SpanWrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A traced function: each call is one span of its node.",
    .tp_new = SpanWrapper_new,
    .tp_dealloc = (destructor)SpanWrapper_dealloc,
    .tp_traverse = (traverseproc)SpanWrapper_traverse,
    .tp_clear = (inquiry)SpanWrapper_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SpanWrapper, vectorcall),
    .tp_descr_get = SpanWrapper_descr_get,
    .tp_dictoffset = offsetof(SpanWrapper, dict),
    .tp_weaklistoffset = offsetof(SpanWrapper, weakreflist),
    .tp_getset = SpanWrapper_getset,
    .tp_methods = SpanWrapper_methods,
};

/* ------------------------------------------------------------------------- */
/* TraceableBase: __enter__/__exit__ and start()/stop() for nodes and uses    */

/* asyncio's running loop, or None; asyncio is never imported from here: until the
   program imports it, no loop can be running. */
static PyObject *asyncio_get_running_loop = NULL;
static PyObject *str_asyncio; /* interned: its hash is computed once */

static PyObject *running_loop(void) {
    if (asyncio_get_running_loop == NULL) {
        PyObject *mods = PyImport_GetModuleDict();
        PyObject *aio = mods ? PyDict_GetItemWithError(mods, str_asyncio) : NULL;
        if (aio == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        asyncio_get_running_loop = PyObject_GetAttrString(aio, "_get_running_loop");
        if (asyncio_get_running_loop == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallNoArgs(asyncio_get_running_loop);
}

/* The stack spans of this thread (or asyncio task) nest on; NULL with an error. */
static PyObject *current_stack(void) {
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
    return PyObject_CallNoArgs(R.resolve);
}

/* The entry a with-block or start() leaves in its stack's `open` map:
   (t0, opener, extra, parent id, level, sticky), timed now. */
#define ENTRY_LEN 6
static PyObject *open_entry(PyObject *self, PyObject *extra, PyObject *stk) {
    PyObject *node = get_node(self);
    PyObject *sticky = node ? node_sticky(node) : NULL;
    Py_XDECREF(node);
    if (!sticky)
        return NULL;
    Py_ssize_t lvl = PyList_GET_SIZE(stk);
    PyObject *t0 = PyLong_FromLongLong(now_ns()), *lv = PyLong_FromSsize_t(lvl);
    PyObject *ent = (t0 && lv) ? PyTuple_New(ENTRY_LEN) : NULL;
    if (!ent) {
        Py_XDECREF(t0);
        Py_XDECREF(lv);
        Py_DECREF(sticky);
        return NULL;
    }
    PyObject *par = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(self); Py_INCREF(extra); Py_INCREF(par);
    PyTuple_SET_ITEM(ent, 0, t0);
    PyTuple_SET_ITEM(ent, 1, self);
    PyTuple_SET_ITEM(ent, 2, extra);
    PyTuple_SET_ITEM(ent, 3, par);
    PyTuple_SET_ITEM(ent, 4, lv);
    PyTuple_SET_ITEM(ent, 5, sticky);
    return ent;
}

/* The kind id of the spans of a node or use (0xFFFFFFFF: none). */
static uint32_t span_kid(PyObject *self) {
    PyObject *node = get_node(self);
    uint32_t kid = node ? node_kid(node, str_kid) : 0xFFFFFFFFu;
    Py_XDECREF(node);
    return kid;
}

/* Record the span of an `open` entry, closed at t1. -1: an exception to propagate. */
static int emit_entry(PyObject *ent, PyObject *id, PyObject *stk, PyObject *self, long long t1,
                      PyObject *x) {
    uint32_t kid = span_kid(self);
    PyObject *tid = stk_tid(stk);
    long long t0 = PyLong_AsLongLong(PyTuple_GET_ITEM(ent, 0));
    Py_ssize_t lvl = PyLong_AsSsize_t(PyTuple_GET_ITEM(ent, 4));
    if (!tid || kid == 0xFFFFFFFFu || PyErr_Occurred()) {
        Py_XDECREF(tid);
        PyErr_Clear();
        COUNT_DROP(1);
        return 0;
    }
    int rc = emit_span(kid, t0, t1, id, PyTuple_GET_ITEM(ent, 3), lvl, tid, PyTuple_GET_ITEM(ent, 5),
                       x ? x : PyTuple_GET_ITEM(ent, 2), -1, 0);
    Py_DECREF(tid);
    return rc;
}

static PyObject *Traceable_enter(PyObject *self, PyObject *unused) {
    if (is_on(self) <= 0 || R.local == NULL) {
        PyErr_Clear();
        Py_INCREF(self);
        return self;
    }
    PyObject *stk = current_stack(), *id = NULL, *extra = NULL, *open = NULL, *ent = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto done;
    extra = get_extra(self);
    open = extra ? stk_open(stk) : NULL;
    if (!open || !PyDict_Check(open))
        goto done;
    ent = open_entry(self, extra, stk);
    id = ent ? new_id() : NULL;
    if (!id)
        goto done;
    if (PyDict_SetItem(open, id, ent) < 0)
        goto done;
    if (PyList_Append(stk, id) < 0)
        PyDict_DelItem(open, id);
    else
        NVTX_OPEN(span_kid(self), id, stk, 1);
done:
    PyErr_Clear(); /* entering a span never fails the user's with-statement */
    Py_XDECREF(ent);
    Py_XDECREF(open);
    Py_XDECREF(extra);
    Py_XDECREF(id);
    Py_XDECREF(stk);
    Py_INCREF(self);
    return self;
}

static PyObject *Traceable_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL, *top, *ent;
    if (nargs != 3 || R.local == NULL)
        goto slow;
    if (args[1] != Py_None)
        goto slow; /* an exception: let Python tag the span with args.error */
    stk = local_stk();
    if (stk == Py_None) {
        /* A thread that never recorded has nothing to close (unless inside a loop). */
        PyObject *own = PyObject_GetAttr(R.local, str_thread_stk);
        int never = (own == Py_None);
        Py_XDECREF(own);
        if (never) {
            PyObject *loop = running_loop();
            never = (loop == Py_None);
            Py_XDECREF(loop);
            if (never) {
                Py_DECREF(stk);
                Py_RETURN_FALSE;
            }
        }
        goto slow;
    }
    if (!stk || !PyList_Check(stk))
        goto slow;
    if (PyList_GET_SIZE(stk) < 2) {
        /* nothing open on this thread (inside an event loop LOCAL.stk is None) */
        Py_DECREF(stk);
        Py_RETURN_FALSE;
    }
    /* No event-loop check needed: a span opened inside a loop lives on its task's
       stack (LOCAL.stk is None there), so a match on top of LOCAL.stk is ours. */
    open = stk_open(stk);
    if (!open || !PyDict_Check(open))
        goto slow;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    top = PyList_GET_ITEM(stk, n - 1);
    ent = PyDict_GetItemWithError(open, top);
    if (!ent || !PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != ENTRY_LEN ||
        PyTuple_GET_ITEM(ent, 1) != self)
        goto slow;
    Py_INCREF(ent);
    Py_INCREF(top);
    if (PyDict_DelItem(open, top) < 0 || drop_top(stk) < 0)
        PyErr_Clear();
    int rc = emit_entry(ent, top, stk, self, t1, NULL);
    Py_DECREF(top);
    Py_DECREF(ent);
    Py_DECREF(open);
    Py_DECREF(stk);
    if (rc < 0)
        return NULL;
    Py_RETURN_FALSE;
slow:
    PyErr_Clear();
    Py_XDECREF(open);
    Py_XDECREF(stk);
    if (R.slow_exit == NULL)
        Py_RETURN_FALSE;
    return PyObject_Vectorcall(R.slow_exit, (PyObject *const[]){self, nargs > 0 ? args[0] : Py_None,
                                   nargs > 1 ? args[1] : Py_None, nargs > 2 ? args[2] : Py_None},
                               4, NULL);
}

typedef struct {
    PyObject *state;      /* _recorder.STATE (its open_spans dict is replaced after fork) */
    PyTypeObject *span;   /* _nodes.Span, allocated here and filled through its slots */
    PyObject *no_span;    /* the Span returned when nothing is recorded */
    PyObject *start_slow; /* _Traceable._start_py(self, *args, **kwargs) */
    PyObject *stop_slow;  /* _Traceable._stop_py(self, *args, **kwargs) */
    PyTypeObject *use;    /* _nodes.Use, allocated here for node(args={...}) */
    PyObject *call_slow;  /* _Traceable._call_py(self, *args, **kwargs) */
    PyObject *span_stop_slow; /* Span._stop_py(self, args=None) */
    PyObject *gate;       /* GATE */
} hookstate_t;

static hookstate_t H = {0};
static PyObject *str_open_spans, *str_max_open_spans, *str__forced, *str_args_kw;

static PyObject *configure_hooks(PyObject *self, PyObject *args) {
    hookstate_t h;
    if (!PyArg_ParseTuple(args, "OO!OOOO!OOO", &h.state, &PyType_Type, &h.span, &h.no_span,
                          &h.start_slow, &h.stop_slow, &PyType_Type, &h.use, &h.call_slow,
                          &h.span_stop_slow, &h.gate))
        return NULL;
    PyObject **nw = (PyObject **)&h, **old = (PyObject **)&H;
    for (size_t k = 0; k < sizeof(hookstate_t) / sizeof(PyObject *); k++) {
        Py_INCREF(nw[k]);
        Py_XDECREF(old[k]);
    }
    H = h;
    gate_obj = h.gate;
    find_slot(&slot_obj, (PyObject *)H.span, str__obj);
    find_slot(&slot_token, (PyObject *)H.span, str__token);
    Py_RETURN_NONE;
}

static PyObject *set_update_slow(PyObject *self, PyObject *fn) {
    Py_INCREF(fn);
    Py_XSETREF(update_slow, fn);
    Py_RETURN_NONE;
}

/* fn(self, *args, **kwargs): the Python method a C method falls back to. */
static PyObject *call_method(PyObject *fn, PyObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *full = PyTuple_New(PyTuple_GET_SIZE(args) + 1);
    if (!full)
        return NULL;
    Py_INCREF(self);
    PyTuple_SET_ITEM(full, 0, self);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args); k++) {
        Py_INCREF(PyTuple_GET_ITEM(args, k));
        PyTuple_SET_ITEM(full, k + 1, PyTuple_GET_ITEM(args, k));
    }
    PyObject *r = PyObject_Call(fn, full, kwargs);
    Py_DECREF(full);
    return r;
}

/* node(args={...}) for a node that records now and plain args: the Use is made
   here (its args encoded once, a snapshot); everything else goes to Python. */
static PyObject *Traceable_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (H.use && !off_for_good && PyTuple_GET_SIZE(args) == 0 && kwargs &&
        PyDict_GET_SIZE(kwargs) == 1) {
        PyObject *d = PyDict_GetItemWithError(kwargs, str_args_kw);
        PyObject *node = d && PyDict_CheckExact(d) ? get_node(self) : NULL;
        if (node == self) {
            PyObject *x = NULL, *raw = NULL;
            if (PyDict_GET_SIZE(d) == 0) {
                x = Py_None;
                Py_INCREF(x);
            } else if (is_on(self) > 0) {
                x = plain_extra(d);
            } else {
                raw = d; /* nothing records now: encoded only if it is used later */
                Py_INCREF(raw);
            }
            PyObject *use = (x || raw) ? H.use->tp_alloc(H.use, 0) : NULL;
            if (use) {
                TraceableObject *u = AS_T(use);
                Py_INCREF(self);
                u->node = self;
                u->extra = x;
                u->raw = raw;
                Py_INCREF(Py_None);
                u->forced = Py_None;
                Py_DECREF(node);
                return use;
            }
            Py_XDECREF(raw);
            Py_XDECREF(x);
        }
        Py_XDECREF(node);
        PyErr_Clear();
    }
    if (H.call_slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "dftrace is not configured");
        return NULL;
    }
    return call_method(H.call_slow, self, args, kwargs);
}

static PyObject *call_slow(PyObject *fn, PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject **full = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n + nk + 1));
    if (!full)
        return PyErr_NoMemory();
    full[0] = self;
    for (Py_ssize_t k = 0; k < n + nk; k++)
        full[k + 1] = args[k];
    PyObject *r = PyObject_Vectorcall(fn, full, (size_t)(n + 1), kwnames);
    PyMem_Free(full);
    return r;
}

static PyObject *Traceable_start(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || kwnames || H.span == NULL || R.local == NULL)
        return call_slow(H.start_slow, self, args, nargsf, kwnames);
    if (is_on(self) <= 0) {
        PyErr_Clear();
        Py_INCREF(H.no_span);
        return H.no_span;
    }
    PyObject *stk = current_stack(), *id = NULL, *extra = NULL, *open = NULL, *ent = NULL,
             *spans = NULL, *token = NULL, *span = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto fail;
    extra = get_extra(self);
    open = extra ? stk_open(stk) : NULL;
    spans = open ? PyObject_GetAttr(H.state, str_open_spans) : NULL;
    if (!spans || !PyDict_Check(open) || !PyDict_Check(spans))
        goto fail;
    if (PyDict_GET_SIZE(spans) >= 16) { /* 16: the least max_open_spans accepts */
        PyObject *lim = PyObject_GetAttr(H.state, str_max_open_spans);
        Py_ssize_t limit = lim ? PyLong_AsSsize_t(lim) : -1;
        Py_XDECREF(lim);
        PyErr_Clear();
        if (limit >= 0 && PyDict_GET_SIZE(spans) >= limit) { /* Python refuses and counts */
            Py_DECREF(spans); Py_DECREF(open); Py_DECREF(extra); Py_DECREF(stk);
            return call_slow(H.start_slow, self, args, nargsf, kwnames);
        }
    }
    ent = open_entry(self, extra, stk);
    id = ent ? new_id() : NULL;
    token = id ? PyTuple_Pack(2, stk, id) : NULL;
    span = token ? H.span->tp_alloc(H.span, 0) : NULL;
    if (!span || slot_set(span, &slot_obj, self) < 0 || slot_set(span, &slot_token, token) < 0)
        goto fail;
    if (PyDict_SetItem(open, id, ent) < 0)
        goto fail;
    if (PyList_Append(stk, id) < 0 || PyDict_SetItem(spans, id, stk) < 0) {
        PyDict_DelItem(open, id);
        goto fail;
    }
    NVTX_OPEN(span_kid(self), id, stk, 1);
    Py_DECREF(token); Py_DECREF(ent); Py_DECREF(spans); Py_DECREF(open);
    Py_DECREF(extra); Py_DECREF(id); Py_DECREF(stk);
    return span;
fail:
    PyErr_Clear(); /* never fail the caller: nothing was recorded */
    Py_XDECREF(span); Py_XDECREF(token); Py_XDECREF(ent); Py_XDECREF(spans);
    Py_XDECREF(open); Py_XDECREF(extra); Py_XDECREF(id); Py_XDECREF(stk);
    Py_INCREF(H.no_span);
    return H.no_span;
}

static PyObject *Traceable_stop(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL, *spans = NULL;
    if (PyVectorcall_NARGS(nargsf) || kwnames || H.span == NULL || R.local == NULL)
        goto slow;
    spans = PyObject_GetAttr(H.state, str_open_spans);
    if (!spans || !PyDict_Check(spans))
        goto slow;
    if (PyDict_GET_SIZE(spans) == 0) {
        /* nothing open anywhere: done, unless tracing is on (then Python warns once) */
        if (is_on(self) == 0) {
            Py_DECREF(spans);
            Py_RETURN_NONE;
        }
        goto slow;
    }
    /* The common case: the innermost span on this thread's stack is our start(). */
    stk = local_stk();
    if (!stk || stk == Py_None || !PyList_Check(stk) || PyList_GET_SIZE(stk) < 2)
        goto slow;
    open = stk_open(stk);
    if (!open || !PyDict_Check(open))
        goto slow;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    PyObject *top = PyList_GET_ITEM(stk, n - 1);
    PyObject *ent = PyDict_GetItemWithError(open, top);
    if (!ent || !PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != ENTRY_LEN ||
        PyTuple_GET_ITEM(ent, 1) != self)
        goto slow;
    if (PyDict_Contains(spans, top) != 1)
        goto slow;
    Py_INCREF(ent);
    Py_INCREF(top);
    if (PyDict_DelItem(spans, top) < 0 || PyDict_DelItem(open, top) < 0 ||
        drop_top(stk) < 0)
        PyErr_Clear();
    int rc = emit_entry(ent, top, stk, self, t1, NULL);
    Py_DECREF(top);
    Py_DECREF(ent);
    Py_DECREF(spans);
    Py_DECREF(open);
    Py_DECREF(stk);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
slow:
    PyErr_Clear();
    Py_XDECREF(spans);
    Py_XDECREF(open);
    Py_XDECREF(stk);
    if (H.stop_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(H.stop_slow, self, args, nargsf, kwnames);
}

/* update(args=None, /, **kwargs): a node's sticky args, encoded once here (O(1));
   anything but plain values while recording goes to Python (update_slow). A
   vectorcall: keyword values are read from the call's own array, no dict built. */
static int put_kwargs(PyObject *d, PyObject *given, PyObject *const *kwv, PyObject *kwnames) {
    if (given && given != Py_None && PyDict_Update(d, given) < 0)
        return -1;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(kwnames, k), kwv[k]) < 0)
            return -1;
    return 0;
}

static PyObject *Traceable_update(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    if (off_for_good)
        Py_RETURN_NONE;
    TraceableObject *t = AS_T(self);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *given = n == 1 ? args[0] : NULL;
    int simple = n <= 1 && t->node == self &&
                 (given == NULL || given == Py_None || PyDict_CheckExact(given));
    if (simple && t->pending && PyDict_CheckExact(t->pending) && gate_obj && is_on(gate_obj) == 0) {
        /* nothing records: keep the values as given, encode them when something does */
        if (put_kwargs(t->pending, given, args + n, kwnames) < 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        sticky_gen++;
        Py_RETURN_NONE;
    }
    int plain = simple && update_slow &&
                (t->pending == NULL || !PyDict_Check(t->pending) || PyDict_GET_SIZE(t->pending) == 0) &&
                gate_obj && is_on(gate_obj) > 0;
    if (plain) {
        PyObject *d = (t->own && t->own != Py_None) ? PyObject_GetAttr(t->own, str_args_attr) : PyDict_New();
        if (d && t->own && t->own != Py_None) {
            PyObject *copy = PyDict_Check(d) ? PyDict_Copy(d) : NULL;
            Py_DECREF(d);
            d = copy;
        }
        if (d && put_kwargs(d, given, args + n, kwnames) < 0)
            Py_CLEAR(d);
        PyObject *x = d ? plain_extra(d) : NULL;
        Py_XDECREF(d);
        if (x) {
            Py_XSETREF(t->own, x);
            sticky_gen++;
            Py_RETURN_NONE;
        }
        PyErr_Clear();
    }
    if (!update_slow)
        Py_RETURN_NONE;
    return call_slow(update_slow, self, args, nargsf, kwnames);
}

static PyMethodDef Traceable_methods[] = {
    {"update", (PyCFunction)(void (*)(void))Traceable_update, METH_FASTCALL | METH_KEYWORDS,
     "update(args=None, /, **kwargs): sticky args on the spans of this node and its subtree "
     "that start from now on."},
    {"__enter__", Traceable_enter, METH_NOARGS, "Open a span of this node (nothing when off)."},
    {"__exit__", (PyCFunction)(void (*)(void))Traceable_exit, METH_FASTCALL,
     "Close the span opened by __enter__; exceptions propagate unchanged."},
    {"start", (PyCFunction)(void (*)(void))Traceable_start, METH_FASTCALL | METH_KEYWORDS,
     "start(metadata=False) -> Span: open a span closed by a later stop() (hook style). "
     "With metadata=True write a CM event <name>.start with the time instead."},
    {"stop", (PyCFunction)(void (*)(void))Traceable_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(span=None, metadata=False): close the span from start() (the innermost open "
     "one of this node on the caller's thread/task, or `span`)."},
    {NULL, NULL, 0, NULL}};

static int Traceable_traverse(TraceableObject *t, visitproc visit, void *arg) {
    Py_VISIT(t->node);
    Py_VISIT(t->extra);
    Py_VISIT(t->forced);
    Py_VISIT(t->on);
    Py_VISIT(t->sticky);
    Py_VISIT(t->raw);
    Py_VISIT(t->parent);
    Py_VISIT(t->own);
    Py_VISIT(t->pending);
    return 0;
}

static int Traceable_clear(TraceableObject *t) {
    Py_CLEAR(t->node);
    Py_CLEAR(t->extra);
    Py_CLEAR(t->forced);
    Py_CLEAR(t->on);
    Py_CLEAR(t->sticky);
    Py_CLEAR(t->raw);
    Py_CLEAR(t->parent);
    Py_CLEAR(t->own);
    Py_CLEAR(t->pending);
    return 0;
}

static void Traceable_dealloc(TraceableObject *t) {
    PyObject_GC_UnTrack(t);
    Traceable_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *Traceable_get_extra(PyObject *self, void *closure) { return get_extra(self); }

static int Traceable_set_extra(PyObject *self, PyObject *value, void *closure) {
    TraceableObject *t = AS_T(self);
    Py_XINCREF(value);
    Py_XSETREF(t->extra, value);
    Py_CLEAR(t->raw);
    return 0;
}

static PyGetSetDef Traceable_getset[] = {
    {"_extra", Traceable_get_extra, Traceable_set_extra, "the use's own args (an Extra or None)", NULL},
    {NULL}};

static PyMemberDef Traceable_members[] = {
    {"_node", T_OBJECT, offsetof(TraceableObject, node), 0, NULL},
    {"_forced", T_OBJECT, offsetof(TraceableObject, forced), 0, NULL},
    {"_on", T_OBJECT, offsetof(TraceableObject, on), 0, NULL},
    {"_sticky", T_OBJECT, offsetof(TraceableObject, sticky), 0, NULL},
    {"_sgen", T_ULONGLONG, offsetof(TraceableObject, sgen), 0, NULL},
    {"_kid", T_UINT, offsetof(TraceableObject, kid), 0, NULL},
    {"_ikid", T_UINT, offsetof(TraceableObject, ikid), 0, NULL},
    {"_bkid", T_UINT, offsetof(TraceableObject, bkid), 0, NULL},
    {"_parent", T_OBJECT, offsetof(TraceableObject, parent), 0, NULL},
    {"_own", T_OBJECT, offsetof(TraceableObject, own), 0, NULL},
    {"_pending", T_OBJECT, offsetof(TraceableObject, pending), 0, NULL},
    {NULL}};

static PyTypeObject TraceableBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.TraceableBase",
    .tp_basicsize = sizeof(TraceableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "C __call__, __enter__/__exit__ and start()/stop() for dftrace nodes and uses, "
              "with the fields they read.",
    .tp_new = PyType_GenericNew,
    .tp_call = Traceable_call,
    .tp_methods = Traceable_methods,
    .tp_members = Traceable_members,
    .tp_getset = Traceable_getset,
    .tp_traverse = (traverseproc)Traceable_traverse,
    .tp_clear = (inquiry)Traceable_clear,
    .tp_dealloc = (destructor)Traceable_dealloc,
};

/* ------------------------------------------------------------------------- */
/* SpanBase: Span.stop(args=None) for the token start() returned              */

static PyObject *SpanBase_stop(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    long long t1 = now_ns();
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *a = NULL, *token = NULL, *obj = NULL, *spans = NULL, *open = NULL, *y = NULL;
    if (n + nk > 1 || (nk == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_args_kw) != 0))
        goto slow;
    if (n + nk == 1)
        a = args[0];
    if (a == Py_None)
        a = NULL;
    token = slot_get(self, &slot_token);
    if (!token)
        goto slow;
    if (token == Py_None) {
        Py_DECREF(token);
        Py_RETURN_NONE;
    }
    obj = slot_get(self, &slot_obj);
    spans = (obj && H.state) ? PyObject_GetAttr(H.state, str_open_spans) : NULL;
    if (!spans || !PyDict_Check(spans) || !PyTuple_Check(token) || PyTuple_GET_SIZE(token) != 2)
        goto slow;
    PyObject *stk = PyTuple_GET_ITEM(token, 0), *id = PyTuple_GET_ITEM(token, 1);
    if (!PyList_Check(stk) || PyList_GET_SIZE(stk) < 2 || PyList_GET_ITEM(stk, PyList_GET_SIZE(stk) - 1) != id)
        goto slow;
    open = stk_open(stk);
    if (!open || !PyDict_Check(open) || PyDict_Contains(spans, id) != 1)
        goto slow;
    PyObject *ent = PyDict_GetItemWithError(open, id);
    if (!ent || !PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != ENTRY_LEN || PyTuple_GET_ITEM(ent, 1) != obj)
        goto slow;
    if (a) {
        /* args known only now: encoded here (a snapshot), after the use's own */
        PyObject *own = PyDict_CheckExact(a) ? plain_extra(a) : NULL;
        if (!own && !PyErr_Occurred())
            own = PyObject_CallOneArg(R.to_extra, a);
        if (!own)
            goto slow;
        PyObject *base = PyTuple_GET_ITEM(ent, 2);
        y = base == Py_None ? own : PyObject_CallFunctionObjArgs(R.merge, base, own, NULL);
        if (y != own)
            Py_DECREF(own);
        if (!y)
            goto slow;
    }
    Py_INCREF(ent);
    Py_INCREF(id);
    Py_INCREF(stk);
    if (PyDict_DelItem(spans, id) < 0 || PyDict_DelItem(open, id) < 0 ||
        drop_top(stk) < 0 || slot_set(self, &slot_token, Py_None) < 0)
        PyErr_Clear();
    int rc = emit_entry(ent, id, stk, obj, t1, y);
    Py_DECREF(ent); Py_DECREF(id); Py_DECREF(stk);
    Py_XDECREF(y); Py_DECREF(open); Py_DECREF(spans); Py_DECREF(obj); Py_DECREF(token);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
slow:
    PyErr_Clear();
    Py_XDECREF(y); Py_XDECREF(open); Py_XDECREF(spans); Py_XDECREF(obj); Py_XDECREF(token);
    if (H.span_stop_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(H.span_stop_slow, self, args, nargsf, kwnames);
}

static PyMethodDef SpanBase_methods[] = {
    {"stop", (PyCFunction)(void (*)(void))SpanBase_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(args=None): close this span (safe to call twice). args known only at the end "
     "(output shapes, bytes written) are added to the span's args, encoded now."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject SpanBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "C stop() for the Span tokens start() returns.",
    .tp_new = PyType_GenericNew,
    .tp_methods = SpanBase_methods,
};

/* ------------------------------------------------------------------------- */
/* SpanIter: .iter() — per item a <leaf>.iter span and a <leaf>.block span     */

typedef struct SpanIter {
    PyObject_HEAD
    struct SpanIter *prev_open, *next_open; /* the list of iterators with an open block */
    PyObject *it;      /* the source iterator (NULL once exhausted/closed) */
    PyObject *node;
    PyObject *gate;
    PyObject *extra;   /* Extra or None */
    uint32_t ikid, bkid;
    long long count;
    /* the open block span */
    int block_open;
    PyObject *bstk, *bid, *bp, *btid, *bsticky;
    Py_ssize_t blvl;
    long long bt0;
} SpanIter;

/* Iterators whose loop-body span is open, so that one whose body span ends while
   another iterator's is still open above it (zip(a.iter(x), b.iter(y))) can end
   that one first: both then nest. */
static SpanIter *open_iters = NULL;

static void link_open(SpanIter *s) {
    s->prev_open = NULL;
    s->next_open = open_iters;
    if (open_iters)
        open_iters->prev_open = s;
    open_iters = s;
}

static void unlink_open(SpanIter *s) {
    if (s->prev_open)
        s->prev_open->next_open = s->next_open;
    else if (open_iters == s)
        open_iters = s->next_open;
    if (s->next_open)
        s->next_open->prev_open = s->prev_open;
    s->prev_open = s->next_open = NULL;
}

static int close_block(SpanIter *s, long long t2);

/* Before closing s's block: end the blocks of other iterators still open above it. */
static int close_blocks_above(SpanIter *s, long long t2) {
    PyObject *stk = s->bstk;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    while (n > 0 && PyList_GET_ITEM(stk, n - 1) != s->bid) {
        PyObject *top = PyList_GET_ITEM(stk, n - 1);
        SpanIter *o = open_iters;
        while (o && !(o->block_open && o->bid == top))
            o = o->next_open;
        if (!o)
            return 0; /* not a block: left to stack_pop (unwound) */
        if (close_block(o, t2) < 0)
            return -1;
        Py_ssize_t m = PyList_GET_SIZE(stk);
        if (m >= n)
            return 0;
        n = m;
    }
    return 0;
}

/* Close the loop body's span at t2; -1 when an exception must propagate. */
static int close_block(SpanIter *s, long long t2) {
    if (!s->block_open)
        return 0;
    if (close_blocks_above(s, t2) < 0)
        return -1;
    s->block_open = 0;
    unlink_open(s);
    if (stack_pop(s->bstk, s->bid) < 0)
        PyErr_Clear();
    int rc = emit_span(s->bkid, s->bt0, t2, s->bid, s->bp, s->blvl, s->btid, s->bsticky, s->extra,
                       s->count, 0);
    Py_CLEAR(s->bstk);
    Py_CLEAR(s->bid);
    Py_CLEAR(s->bp);
    Py_CLEAR(s->btid);
    Py_CLEAR(s->bsticky);
    return rc;
}

static PyObject *plain_next(SpanIter *s) {
    PyObject *item = PyIter_Next(s->it);
    if (item)
        s->count++;
    else
        Py_CLEAR(s->it);
    return item;
}

static PyObject *SpanIter_next(SpanIter *s) {
    if (close_block(s, now_ns()) < 0)
        return NULL;
    if (s->it == NULL)
        return NULL;
    int on = is_on(s->gate);
    PyErr_Clear();
    if (on <= 0 || R.local == NULL)
        return plain_next(s);
    PyObject *stk = current_stack();
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_XDECREF(stk);
        PyErr_Clear();
        return plain_next(s);
    }
    PyObject *sticky = node_sticky(s->node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    PyObject *id = new_id();
    PyObject *tid = id ? stk_tid(stk) : NULL;
    if (!tid || PyList_Append(stk, id) < 0) {
        Py_XDECREF(tid); Py_XDECREF(id); Py_DECREF(sticky); Py_DECREF(stk);
        PyErr_Clear();
        return plain_next(s);
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk) - 1;
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    NVTX_OPEN(s->ikid, id, stk, 1);
    long long t0 = now_ns();
    PyObject *item = PyIter_Next(s->it);
    long long t1 = now_ns();
    if (stack_pop(stk, id) < 0)
        PyErr_Clear();
    if (item == NULL) {
        Py_CLEAR(s->it);
        if (PyErr_Occurred()) {
            /* the source raised: record the .iter span with args.error, re-raise */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyErr_NormalizeException(&et, &ev, &tb);
            PyObject *x = PyObject_CallFunctionObjArgs(R.with_error, s->extra, ev ? ev : Py_None, NULL);
            if (!x) {
                PyErr_Clear();
                x = s->extra;
                Py_INCREF(x);
            }
            if (emit_span(s->ikid, t0, t1, id, p, lvl, tid, sticky, x, -1, 0) < 0) {
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            } else {
                PyErr_Restore(et, ev, tb);
            }
            Py_DECREF(x);
        } else {
            NVTX_CLOSE(id); /* the end: no .iter span is recorded */
        }
        Py_DECREF(sticky); Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    s->count++;
    if (emit_span(s->ikid, t0, t1, id, p, lvl, tid, sticky, s->extra, s->count, 0) < 0) {
        Py_DECREF(item);
        Py_DECREF(sticky); Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    Py_DECREF(id);
    /* the loop body's span: open until the next call (or close/dealloc) */
    PyObject *bid = new_id();
    if (bid && PyList_Append(stk, bid) == 0) {
        NVTX_OPEN(s->bkid, bid, stk, 1);
        s->block_open = 1;
        s->bstk = stk;
        s->bid = bid;
        s->bp = p;
        s->btid = tid;
        s->bsticky = sticky;
        s->blvl = lvl;
        s->bt0 = t1;
        link_open(s);
        return item;
    }
    PyErr_Clear();
    Py_XDECREF(bid);
    Py_DECREF(sticky);
    Py_DECREF(p);
    Py_DECREF(tid);
    Py_DECREF(stk);
    return item;
}

static PyObject *SpanIter_close(SpanIter *s, PyObject *unused) {
    int rc = close_block(s, now_ns());
    Py_CLEAR(s->it);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *SpanIter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *node, *gate, *extra, *iterable;
    if (!PyArg_ParseTuple(args, "OOOO", &node, &gate, &extra, &iterable))
        return NULL;
    PyObject *it = PyObject_GetIter(iterable);
    if (!it)
        return NULL;
    SpanIter *s = (SpanIter *)type->tp_alloc(type, 0);
    if (!s) {
        Py_DECREF(it);
        return NULL;
    }
    s->it = it;
    Py_INCREF(node); Py_INCREF(gate); Py_INCREF(extra);
    s->node = node;
    s->gate = gate;
    s->extra = extra;
    s->ikid = node_kid(node, str_ikid);
    s->bkid = node_kid(node, str_bkid);
    return (PyObject *)s;
}

static int SpanIter_traverse(SpanIter *s, visitproc visit, void *arg) {
    Py_VISIT(s->it); Py_VISIT(s->node); Py_VISIT(s->gate); Py_VISIT(s->extra);
    Py_VISIT(s->bstk); Py_VISIT(s->bid); Py_VISIT(s->bp); Py_VISIT(s->btid); Py_VISIT(s->bsticky);
    return 0;
}

static int SpanIter_clear(SpanIter *s) {
    Py_CLEAR(s->it); Py_CLEAR(s->node); Py_CLEAR(s->gate); Py_CLEAR(s->extra);
    if (s->block_open)
        unlink_open(s);
    s->block_open = 0;
    Py_CLEAR(s->bstk); Py_CLEAR(s->bid); Py_CLEAR(s->bp); Py_CLEAR(s->btid); Py_CLEAR(s->bsticky);
    return 0;
}

static void SpanIter_dealloc(SpanIter *s) {
    PyObject_GC_UnTrack(s);
    if (s->block_open && s->node) {
        /* a loop left with break or an exception: close the body's span now */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (close_block(s, now_ns()) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    SpanIter_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef SpanIter_methods[] = {
    {"close", (PyCFunction)SpanIter_close, METH_NOARGS, "Stop iterating; close the open span."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject SpanIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanIter",
    .tp_basicsize = sizeof(SpanIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An iterable wrapped by node.iter(): .iter and .block spans per item.",
    .tp_new = SpanIter_new,
    .tp_dealloc = (destructor)SpanIter_dealloc,
    .tp_traverse = (traverseproc)SpanIter_traverse,
    .tp_clear = (inquiry)SpanIter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)SpanIter_next,
    .tp_methods = SpanIter_methods,
};

/* ------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(local, resolve, wait_room, wake, unwind, with_error, merge, to_extra, sticky_of, extra_type, slow_exit)"},
    {"configure_hooks", configure_hooks, METH_VARARGS,
     "configure_hooks(state, span_type, no_span, start_slow, stop_slow)"},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(kid, t0, t1, id, parent, level, tid, sticky=None, extra=None, count=-1, flags=0)"},
    {"drain", drain, METH_VARARGS,
     "drain(max_records, pid_piece, hh_piece, offset_ns, min_id) -> (bytes, records taken)"},
#ifdef HAVE_NATIVE_WRITE
    {"drain_write", drain_write, METH_VARARGS,
     "drain_write(fd, level, frame_records, max_records, pid_piece, hh_piece, offset_ns, min_id, "
     "prefix) -> (taken, written, bytes, errno, st_nlink): frames encoded, compressed and written"},
#endif
    {"in_flight", in_flight, METH_NOARGS, "Records in a drain_write() under way."},
#ifdef HAVE_WRITE_LOOP
    {"write_loop", write_loop, METH_VARARGS,
     "write_loop(fd, level, frame_records, seconds, max_bytes, pid_piece, hh_piece, offset_ns, "
     "min_id) -> (taken, written, bytes, errno, st_nlink): write full batches without the GIL"},
    {"kick", kick, METH_NOARGS, "Make write_loop() return now."},
    {"writing_since", writing_since, METH_NOARGS, "When write_loop's write under way began (0.0: none)."},
    {"frames_written", frames_written, METH_NOARGS, "Frames the engine has written whole, ever."},
#endif
    {"native_write", native_write, METH_NOARGS,
     "The compressions drain_write() can do here."},
    {"gunzip_members", gunzip_members, METH_VARARGS,
     "gunzip_members(data, start, limit) -> (decoded, consumed) or None: whole gzip members via libdeflate"},
    {"add_kind", add_kind, METH_O, "add_kind(piece) -> kid"},
    {"shm_attach", shm_attach, METH_VARARGS,
     "shm_attach(region, pid, pid_piece, hh_piece, offset_ns, min_id): record into a shared-memory ring"},
    {"shm_detach", shm_detach, METH_NOARGS, "Record into process memory again."},
    {"shm_finish", shm_finish, METH_NOARGS, "Seal the ring's last slot and mark it finalized."},
    {"shm_local", shm_set_local, METH_O, "shm_local(on) -> before: record into process memory while captures run"},
    {"shm_seal_now", shm_seal_now, METH_NOARGS, "Seal the ring's slot being filled."},
    {"shm_state", shm_state, METH_NOARGS, "(free slots, slots, drainer_busy_ns, commits), or None"},
    {"shm_append_line", shm_append_line, METH_O, "shm_append_line(line) -> recorded (bool)"},
    {"reset", reset, METH_NOARGS, "Forget every buffered record."},
    {"after_fork", after_fork, METH_NOARGS, "In a forked child: a fresh buffer and lock."},
    {"set_limits", set_limits, METH_VARARGS, "set_limits(batch_size, buffer_limit, drop_when_full)"},
    {"set_nvtx", set_nvtx, METH_VARARGS,
     "set_nvtx(open_range, close_range): every span also calls these (None, None: off)"},
    {"buffered", buffered, METH_NOARGS, "Records buffered now."},
    {"dropped", get_dropped, METH_NOARGS, "Records dropped and counted so far."},
    {"set_dropped", set_dropped, METH_O, "Set the dropped counter."},
    {"new_id", new_id_py, METH_NOARGS, "The next span id."},
    {"stacks_changed", stacks_changed, METH_NOARGS, "A LOCAL.stk was assigned: threads read theirs again."},
    {"bump_sticky_gen", bump_sticky_gen, METH_NOARGS, "Sticky args changed: nodes refresh theirs on next use."},
    {"sticky_gen", get_sticky_gen, METH_NOARGS, "The generation of the sticky args in force."},
    {"clock_ns", clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns)"},
    {"set_options", set_options, METH_VARARGS, "set_options(max_arg_length, off_for_good)"},
    {"set_update_slow", set_update_slow, METH_O, "The Python update() for every case but plain values."},
    {"plain_fragment", plain_fragment_py, METH_O,
     "plain_fragment(d) -> (frag, mask, nested) for a dict of plain keys and JSON values, else None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_speedups",
                                       "dftrace's recording engine in C.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
#define INTERN(v, s) if (!(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(str_stk, "stk");
    INTERN(str_thread_stk, "thread_stk");
    INTERN(str_on, "_on");
    INTERN(str_kid, "_kid");
    INTERN(str_ikid, "_ikid");
    INTERN(str_bkid, "_bkid");
    INTERN(str_tid, "tid");
    INTERN(str_open, "open");
    INTERN(str_extra, "_extra");
    INTERN(str_node, "_node");
    INTERN(str_frag, "frag");
    INTERN(str_mask, "mask");
    INTERN(str_sgen, "_sgen");
    INTERN(str_sticky, "_sticky");
    INTERN(str_open_spans, "open_spans");
    INTERN(str_max_open_spans, "max_open_spans");
    INTERN(str__obj, "_obj");
    INTERN(str__token, "_token");
    INTERN(str__forced, "_forced");
    INTERN(str_args_kw, "args");
    INTERN(str_args_attr, "args");
    INTERN(str__args, "_args");
    INTERN(str_asyncio, "asyncio");
#undef INTERN
    if (PyType_Ready(&SpanWrapperType) < 0 || PyType_Ready(&TraceableBaseType) < 0 ||
        PyType_Ready(&SpanIterType) < 0 || PyType_Ready(&SpanBaseType) < 0 ||
        PyType_Ready(&ShmReaderType) < 0)
        return NULL;
    if (!RingError && !(RingError = PyErr_NewException("dftrace._core._speedups.RingError",
                                                         PyExc_ValueError, NULL)))
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "RingError", RingError) < 0 ||
        PyModule_AddObjectRef(m, "SpanWrapper", (PyObject *)&SpanWrapperType) < 0 ||
        PyModule_AddObjectRef(m, "SpanIter", (PyObject *)&SpanIterType) < 0 ||
        PyModule_AddObjectRef(m, "TraceableBase", (PyObject *)&TraceableBaseType) < 0 ||
        PyModule_AddObjectRef(m, "SpanBase", (PyObject *)&SpanBaseType) < 0 ||
        PyModule_AddObjectRef(m, "ShmReader", (PyObject *)&ShmReaderType) < 0 ||
        PyModule_AddIntConstant(m, "SHM_FIXED_BYTES", (long)(SHM_HEADER_BYTES + SHM_KINDS_BYTES)) < 0 ||
        PyModule_AddIntConstant(m, "SHM_SLOT_BYTES", (long)SHM_SLOT_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "SHM_SLOT_RECORDS", (long)CHUNK_RECS) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(rec_t)) < 0 ||
        PyModule_AddIntConstant(m, "CHUNK_RECORDS", (long)CHUNK_RECS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
