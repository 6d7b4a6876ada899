/* writer.c: records to the file. drain() hands Python the encoded lines; with
 * drain_write() and write_loop() (the writer thread's wait) the engine itself takes
 * the full chunks, encodes, compresses and writes them as frames with the GIL
 * released once. zstd and libdeflate are the system's, dlopen'd at first use. */
#include "writer.h"
#include "encoder.h"
#include "records.h"

/* drain(max_records, pid_piece, hh_piece, offset_ns, min_id) -> (bytes, n) */
static PyObject *drain(PyObject *self, PyObject *args) {
    Py_ssize_t maxn, npid, nhh;
    const char *pidp, *hhp;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "ny#y#LL", &maxn, &pidp, &npid, &hhp, &nhh, &off, &min_id))
        return NULL;
    Py_ssize_t n;
    size_t upper;
    chunk_t *first = dft_detach(maxn, npid + nhh, &n, &upper);
    if (!first)
        return Py_BuildValue("(y#n)", "", (Py_ssize_t)0, (Py_ssize_t)0);
    kind_t *ks = dft_kinds;
    Py_ssize_t nk = dft_nkinds;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)upper);
    if (!out) {
        dft_free_chunks(first);
        COUNT_DROP(n);
        return NULL;
    }
    char *o0 = PyBytes_AS_STRING(out), *o = o0;
    Py_BEGIN_ALLOW_THREADS
    o = dft_encode_chunks(first, o0, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    Py_END_ALLOW_THREADS
    dft_recycle_chunks(first);
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
    void *cctx;
    zstd_compress_fn compress;
    zstd_bound_fn bound;
    zstd_iserror_fn iserror;
} zstd;

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
/* A system library by the names it goes by, opened at first use. */
typedef struct {
    int tried;
    void *handle;
    const char *names[4];
} Library;

/* The library's handle at the first call (NULL without it), NULL at the later ones:
   its symbols are looked up once. */
static void *library_once(Library *lib) {
    if (lib->tried)
        return NULL;
    lib->tried = 1;
    for (size_t i = 0; i < sizeof(lib->names) / sizeof(lib->names[0]) && !lib->handle; i++)
        lib->handle = dlopen(lib->names[i], RTLD_NOW | RTLD_LOCAL);
    return lib->handle;
}

static Library zstd_library = {0, NULL, {"libzstd.so.1", "libzstd.1.dylib", "libzstd.so", "libzstd.dylib"}};
static Library deflate_library = {0, NULL,
                                  {"libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.so", "libdeflate.dylib"}};

int dft_load_zstd(void) {
    void *h = library_once(&zstd_library);
    if (h) {
        zstd_create_fn create = (zstd_create_fn)dlsym(h, "ZSTD_createCCtx");
        zstd.compress = (zstd_compress_fn)dlsym(h, "ZSTD_compressCCtx");
        zstd.bound = (zstd_bound_fn)dlsym(h, "ZSTD_compressBound");
        zstd.iserror = (zstd_iserror_fn)dlsym(h, "ZSTD_isError");
        if (create && zstd.compress && zstd.bound && zstd.iserror) /* else incomplete: not used */
            zstd.cctx = create();
    }
    return zstd.cctx != NULL;
}

/* gzip members from the system's libdeflate (deflate-compatible, faster than zlib),
   loaded at first use; without it the writer compresses gzip in Python. A `level`
   of GZIP_LEVEL_BASE + n asks for gzip at libdeflate's level n (1..12). */
#define GZIP_LEVEL_BASE 100
typedef void *(*deflate_alloc_fn)(int);
typedef size_t (*deflate_gzip_fn)(void *, const void *, size_t, void *, size_t);
typedef size_t (*deflate_bound_fn)(void *, size_t);
static struct {
    deflate_alloc_fn alloc;
    deflate_gzip_fn gzip;
    deflate_bound_fn bound;
    void *by_level[13];
} gz;

static int load_gzip(void) {
    void *h = library_once(&deflate_library);
    if (h) {
        gz.alloc = (deflate_alloc_fn)dlsym(h, "libdeflate_alloc_compressor");
        gz.gzip = (deflate_gzip_fn)dlsym(h, "libdeflate_gzip_compress");
        gz.bound = (deflate_bound_fn)dlsym(h, "libdeflate_gzip_compress_bound");
        if (!(gz.alloc && gz.gzip && gz.bound))
            gz.gzip = NULL; /* an incomplete library: not used */
    }
    return gz.gzip != NULL;
}

#else
int dft_load_zstd(void) { return 0; }
static int load_gzip(void) { return 0; }
#endif

/* native_write() -> the compressions drain_write() can do ("none", "zstd", "gzip") */
static PyObject *native_write(PyObject *self, PyObject *unused) {
#ifdef HAVE_NATIVE_WRITE
    return Py_BuildValue("(sss)", "none", dft_load_zstd() ? "zstd" : "none",
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

int dft_ensure(char **buf, size_t *cap, size_t need) {
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
int dft_compress_write(int fd, int level, const char *src, size_t len, char **zb,
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
        if (dft_ensure(zb, zcap_, bound) < 0)
            return ENOMEM;
        size_t z = gz.gzip(gz.by_level[n], src, len, *zb, bound);
        if (!z)
            return EIO;
        src = *zb;
        len = z;
    } else if (level >= 0) {
        size_t bound = zstd.bound(len);
        if (dft_ensure(zb, zcap_, bound) < 0)
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
        upper += (size_t)k->n * (size_t)(REC_FIXED + dft_max_kind_len + npid + nhh) + k->alen;
    *written = 0;
    if (dft_ensure(&enc_buf, &enc_cap, upper) < 0)
        return ENOMEM;
    memcpy(enc_buf, pre, (size_t)npre);
    char *o = enc_buf + npre;
    if (c != end) {
        /* encode_chunks stops at the end of the list: cut it there for the call */
        chunk_t *last = c;
        while (last->next != end)
            last = last->next;
        last->next = NULL;
        o = dft_encode_chunks(c, o, ks, nk, pidp, npid, hhp, nhh, off, min_id);
        last->next = end;
    }
    return dft_compress_write(fd, level, enc_buf, (size_t)(o - enc_buf), &zbuf, &zcap, written);
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
    if (level >= 0 && !dft_load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    Py_ssize_t n;
    size_t upper;
    chunk_t *first = dft_detach(maxn, 0, &n, &upper);
    if (!first && !npre)
        return Py_BuildValue("(nnnii)", (Py_ssize_t)0, (Py_ssize_t)0, (Py_ssize_t)0, 0, -1);
    kind_t *ks = dft_kinds;
    Py_ssize_t nk = dft_nkinds;
    int err = 0;
    long nlink = -1;
    Py_ssize_t done = 0, bytes = 0;
    int room = dft_spare_room(); /* chunks the spare list can take back */
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
    dft_free_chunks(k);
    Py_END_ALLOW_THREADS
    inflight = 0;
    dft_recycle_chunks(keep);
    return Py_BuildValue("(nnnil)", n, done, bytes, err, nlink);
}
#endif

#ifdef HAVE_WRITE_LOOP
static long long writing_since_ns = 0; /* start of the loop's write under way, 0: none */

/* The full chunks (all before the tail), taken under qlock; NULL: none. */
static chunk_t *take_full(Py_ssize_t *n) {
    *n = 0;
    if (!dft_head || dft_head == dft_tail)
        return NULL;
    chunk_t *first = dft_head, *last = dft_head;
    Py_ssize_t k = dft_head->n;
    while (last->next != dft_tail) {
        last = last->next;
        k += last->n;
    }
    last->next = NULL;
    dft_head = dft_tail;
    dft_full_recs = 0;
    __atomic_store_n(&dft_taken, dft_taken + (unsigned long long)k, __ATOMIC_RELAXED);
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
    if (level >= 0 && !dft_load_zstd()) {
        PyErr_SetString(PyExc_RuntimeError, "zstd is not available to the C engine");
        return NULL;
    }
    kind_t *ks = dft_kinds;
    Py_ssize_t nk = dft_nkinds;
    Py_ssize_t all = 0, done = 0, bytes = 0;
    int err = 0;
    long nlink = -1;
    long long deadline = now_ns() + (long long)(seconds * 1e9);
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        QLOCK();
        Py_ssize_t n = 0;
        chunk_t *first = NULL;
        while (!dft_kicked) {
            if (dft_full_recs >= dft_batch_size) {
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
            dft_loop_waiting = 1;
            pthread_cond_timedwait(&dft_qcond, &dft_qlock, &ts);
            dft_loop_waiting = 0;
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
        dft_recycle_chunks(first);
        if (err || (max_bytes && bytes >= max_bytes))
            break;
    }
    if (!err && done) {
        struct stat st;
        if (fstat(fd, &st) == 0)
            nlink = (long)st.st_nlink;
    }
    QLOCK();
    dft_kicked = 0;
    QUNLOCK();
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(nnnil)", all, done, bytes, err, nlink);
}

/* kick(): make write_loop() return now (a flush, a sync or the end is asked for). */
static PyObject *kick(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    QLOCK();
    dft_kicked = 1;
    pthread_cond_signal(&dft_qcond);
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

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_writer_methods[] = {
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
    {NULL, NULL, 0, NULL}};
