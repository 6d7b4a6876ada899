/* members.c: the trace readers' fast path, dftrace.format._members. Whole gzip
 * members (the system's libdeflate) and whole zstd frames (the system's libzstd)
 * decoded without the GIL, each library opened at first use; without it a function
 * returns None and the reader's streaming decoder (zlib, zstandard) does the work.
 * Nothing here is shared with the recorder. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A decoder of whole members or frames. `run` decodes the whole ones of
   src[*pos..n) one after the other into dst[*used..room), without the GIL,
   advancing both; it stops at one that does not decode whole there. */
typedef struct {
    int (*load)(void);
    void *(*create)(void);
    void (*release)(void *);
    void (*run)(void *, const unsigned char *, size_t, size_t *, char *, size_t, size_t *);
} WholeDecoder;

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>

/* The first of `names` that opens (NULL for none) at the first call (`*tried` 0),
   NULL at the later ones: a library's symbols are looked up once. */
static void *open_library_once(int *tried, const char *const names[4]) {
    void *handle = NULL;
    if (*tried)
        return NULL;
    *tried = 1;
    for (int i = 0; i < 4 && !handle; i++)
        handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    return handle;
}

/* zstd, a whole frame at a time (frames that give their decoded size, as the
   recorder and zstd's one-shot API write them). */
static struct {
    int tried;
    void *(*create)(void);
    size_t (*release)(void *);
    size_t (*decompress)(void *, void *, size_t, const void *, size_t);
    size_t (*frame_size)(const void *, size_t);
    unsigned long long (*content_size)(const void *, size_t);
    unsigned (*iserror)(size_t);
} unzstd;

static int load_unzstd(void) {
    static const char *const names[4] = {"libzstd.so.1", "libzstd.1.dylib", "libzstd.so", "libzstd.dylib"};
    void *h = open_library_once(&unzstd.tried, names);
    if (h) {
        *(void **)&unzstd.create = dlsym(h, "ZSTD_createDCtx");
        *(void **)&unzstd.release = dlsym(h, "ZSTD_freeDCtx");
        *(void **)&unzstd.decompress = dlsym(h, "ZSTD_decompressDCtx");
        *(void **)&unzstd.frame_size = dlsym(h, "ZSTD_findFrameCompressedSize");
        *(void **)&unzstd.content_size = dlsym(h, "ZSTD_getFrameContentSize");
        *(void **)&unzstd.iserror = dlsym(h, "ZSTD_isError");
        if (!(unzstd.create && unzstd.release && unzstd.frame_size && unzstd.content_size && unzstd.iserror))
            unzstd.decompress = NULL; /* an incomplete library: not used */
    }
    return unzstd.decompress != NULL;
}

/* gzip: libdeflate_gzip_decompress_ex decodes one whole member into a buffer large
   enough for it. */
static struct {
    int tried;
    void *(*alloc)(void);
    void (*release)(void *);
    int (*gunzip)(void *, const void *, size_t, void *, size_t, size_t *, size_t *);
} gunz;

static int load_gunzip(void) {
    static const char *const names[4] = {"libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.so",
                                         "libdeflate.dylib"};
    void *h = open_library_once(&gunz.tried, names);
    if (h) {
        *(void **)&gunz.alloc = dlsym(h, "libdeflate_alloc_decompressor");
        *(void **)&gunz.release = dlsym(h, "libdeflate_free_decompressor");
        *(void **)&gunz.gunzip = dlsym(h, "libdeflate_gzip_decompress_ex");
        if (!(gunz.alloc && gunz.release && gunz.gunzip))
            gunz.gunzip = NULL; /* an incomplete library: not used */
    }
    return gunz.gunzip != NULL;
}

static void *gunzip_create(void) { return gunz.alloc(); }
static void gunzip_release(void *d) { gunz.release(d); }
static void gunzip_run(void *d, const unsigned char *src, size_t n, size_t *pos, char *dst, size_t room,
                       size_t *used) {
    while (*pos < n && *used < room) {
        size_t in_used = 0, out_used = 0;
        /* 0: LIBDEFLATE_SUCCESS */
        if (gunz.gunzip(d, src + *pos, n - *pos, dst + *used, room - *used, &in_used, &out_used) != 0)
            break;
        *pos += in_used;
        *used += out_used;
    }
}

static void *unzstd_create(void) { return unzstd.create(); }
static void unzstd_release(void *d) { unzstd.release(d); }
static void unzstd_run(void *d, const unsigned char *src, size_t n, size_t *pos, char *dst, size_t room,
                       size_t *used) {
    while (n - *pos >= 4) {
        const unsigned char *at = src + *pos;
        /* A zstd frame's magic number, little-endian: other frames are left to the caller. */
        if (at[0] != 0x28 || at[1] != 0xB5 || at[2] != 0x2F || at[3] != 0xFD)
            break;
        size_t frame = unzstd.frame_size(at, n - *pos);
        if (unzstd.iserror(frame))
            break;
        unsigned long long size = unzstd.content_size(at, frame);
        if (size > room - *used) /* also the unknown and error values, the largest numbers */
            break;
        size_t got = unzstd.decompress(d, dst + *used, (size_t)size, at, frame);
        if (unzstd.iserror(got) || got != size)
            break;
        *pos += frame;
        *used += got;
    }
}

static const WholeDecoder gunzip_decoder = {load_gunzip, gunzip_create, gunzip_release, gunzip_run};
static const WholeDecoder unzstd_decoder = {load_unzstd, unzstd_create, unzstd_release, unzstd_run};
#define GUNZIP (&gunzip_decoder)
#define UNZSTD (&unzstd_decoder)
#else /* no library opens: each function returns None */
#define GUNZIP NULL
#define UNZSTD NULL
#endif

/* (decoded, consumed) of `w` over data[start:] into at most `limit` bytes, or None
   without its library (`w` NULL: no library can open here). */
static PyObject *decode_whole(PyObject *args, const WholeDecoder *w) {
    if (w == NULL)
        Py_RETURN_NONE;
    Py_buffer in;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "y*nn", &in, &start, &limit))
        return NULL;
    if (!w->load() || limit <= 0 || start < 0 || start > in.len) {
        PyBuffer_Release(&in);
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, limit);
    void *d = out ? w->create() : NULL;
    if (!d) {
        Py_XDECREF(out);
        PyBuffer_Release(&in);
        return out ? PyErr_NoMemory() : NULL;
    }
    size_t pos = (size_t)start, used = 0;
    Py_BEGIN_ALLOW_THREADS
    w->run(d, (const unsigned char *)in.buf, (size_t)in.len, &pos, PyBytes_AS_STRING(out), (size_t)limit, &used);
    Py_END_ALLOW_THREADS
    w->release(d);
    PyBuffer_Release(&in);
    if (_PyBytes_Resize(&out, (Py_ssize_t)used) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, (Py_ssize_t)(pos - (size_t)start));
}

/* gunzip_members(data, start, limit) -> (decoded, consumed), or None without
   libdeflate: the whole gzip members of data[start:] decoded one after the other,
   without the GIL, until about `limit` bytes came out. Stops early, returning what
   it has, at a member that does not decode whole here (cut by the end of `data`,
   longer than the room left, damaged): the caller's streaming decoder takes that
   one, and tells a cut from damage. */
static PyObject *gunzip_members(PyObject *self, PyObject *args) { return decode_whole(args, GUNZIP); }

/* unzstd_frames(data, start, limit) -> (decoded, consumed), or None without
   libzstd: the whole zstd frames of data[start:] decoded one after the other,
   without the GIL, while their decoded sizes fit in `limit` bytes. Stops early,
   returning what it has, at a frame that does not decode whole here (cut by the end
   of `data`, without its decoded size, larger than the room left, a skippable
   frame, damaged): the caller's streaming decoder takes that one, and tells a cut
   from damage. */
static PyObject *unzstd_frames(PyObject *self, PyObject *args) { return decode_whole(args, UNZSTD); }

static PyMethodDef methods[] = {
    {"gunzip_members", gunzip_members, METH_VARARGS,
     "gunzip_members(data, start, limit) -> (decoded, consumed) or None: whole gzip members via libdeflate"},
    {"unzstd_frames", unzstd_frames, METH_VARARGS,
     "unzstd_frames(data, start, limit) -> (decoded, consumed) or None: whole zstd frames via libzstd"},
    {NULL, NULL, 0, NULL},
};

/* The libraries are looked up once per process, under the GIL: interpreters that
   share the main GIL may load the module, those with a GIL of their own read
   through the streaming decoders. */
static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "dftrace.format._members",
                                    "Whole gzip members and zstd frames decoded without the GIL.", 0, methods,
                                    slots, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__members(void) { return PyModuleDef_Init(&module); }
