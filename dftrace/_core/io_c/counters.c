/* counters.c: the table of each file's counters (counters.h). The files are kept
 * one after another, in the order they came (the table grows by doubling up to
 * IO_FILES_MAX), found through an index of their positions: a process touches
 * only the memory of the files it counts, whatever their hashes. All of it runs in
 * the thread that drains, holding the GIL. */
#define PY_SSIZE_T_CLEAN
#include "../engine_c/digits.h" /* first: it includes Python.h */
#include "counters.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

const uint8_t io_kind_of[OP_COUNT] = {
    [OP_READ] = K_READ, [OP_PREAD] = K_READ, [OP_READV] = K_READ, [OP_PREADV] = K_READ,
    [OP_FREAD] = K_READ, [OP_FGETS] = K_READ, [OP_SENDFILE_READ] = K_READ,
    [OP_COPY_RANGE_READ] = K_READ,
    [OP_WRITE] = K_WRITE, [OP_PWRITE] = K_WRITE, [OP_WRITEV] = K_WRITE,
    [OP_PWRITEV] = K_WRITE, [OP_FWRITE] = K_WRITE, [OP_FPUTS] = K_WRITE,
    [OP_SENDFILE_WRITE] = K_WRITE, [OP_COPY_RANGE_WRITE] = K_WRITE,
    [OP_FSYNC] = K_SYNC, [OP_FDATASYNC] = K_SYNC,
    [OP_MMAP] = K_OTHER,
};

/* Darshan's buckets: 0-100, 100-1K, 1K-10K, 10K-100K, 100K-1M, 1M-4M, 4M-10M,
   10M-100M, 100M-1G, 1G+. */
const int64_t io_bucket_tops[HIST] = {100, 1024, 10240, 102400, 1048576, 4194304,
                                      10485760, 104857600, 1073741824, INT64_MAX};
/* A size n in [2^l, 2^(l+1)) is in bucket io_bucket_of_log2[l] or the next (no two
   tops are within a factor of two). */
uint8_t io_bucket_of_log2[64];

void io_counters_init(void) {
    for (int l = 0; l < 64; l++) {
        int b = 0;
        while (b < HIST - 1 && (l >= 62 || (int64_t)1 << l >= io_bucket_tops[b]))
            b++;
        io_bucket_of_log2[l] = (uint8_t)b;
    }
}

static file_t *files = NULL;   /* files_n of files_cap used, in the order they came */
static uint32_t *places = NULL; /* nplaces (a power of two, 2 x files_cap): 1 + a file's position, 0: none */
static size_t files_n = 0, files_cap = 0, nplaces = 0;
file_t *io_last_file = NULL; /* the file of the last call: the next one's, often */

static void place(size_t i) {
    size_t j = files[i].fhash & (nplaces - 1);
    while (places[j])
        j = (j + 1) & (nplaces - 1);
    places[j] = (uint32_t)i + 1;
}

/* Room for twice the files (at most IO_FILES_MAX); -1 when memory ran out. */
static int grow(void) {
    size_t cap = files_cap ? files_cap * 2 : 64;
    if (cap > IO_FILES_MAX)
        cap = IO_FILES_MAX;
    file_t *more = realloc(files, cap * sizeof(file_t));
    if (!more)
        return -1;
    files = more;
    uint32_t *p = calloc(cap * 2, sizeof(uint32_t));
    if (!p)
        return -1;
    free(places);
    places = p;
    files_cap = cap;
    nplaces = cap * 2;
    for (size_t i = 0; i < files_n; i++)
        place(i);
    io_last_file = NULL;
    return 0;
}

int io_counters_full(void) { return files_n >= IO_FILES_MAX; }

file_t *io_counters_find(uint64_t h) {
    if (nplaces) {
        size_t j = h & (nplaces - 1);
        for (uint32_t at; (at = places[j]); j = (j + 1) & (nplaces - 1))
            if (files[at - 1].fhash == h)
                return io_last_file = &files[at - 1];
    }
    if (files_n == files_cap && (files_cap == IO_FILES_MAX || grow() < 0))
        return NULL;
    file_t *f = &files[files_n];
    memset(f, 0, sizeof(*f));
    f->fhash = h;
    f->read.last_off = f->write.last_off = -1;
    f->read.last_end = f->write.last_end = -1;
    f->first_ns = INT64_MAX;
    place(files_n++);
    return io_last_file = f;
}

void io_counters_forget(void) {
    for (size_t i = 0; i < files_n; i++)
        free(files[i].path);
    files_n = 0;
    if (places)
        memset(places, 0, nplaces * sizeof(uint32_t));
    io_last_file = NULL;
}

int io_counters_lines(text_t *t, long long off, const char *head, size_t nhead) {
    int bad = 0;
    for (size_t i = 0; !bad && i < files_n; i++) {
        const file_t *f = &files[i];
        const struct {
            const char *key;
            long long v;
        } fields[] = {
            {"read_ops", f->read.ops}, {"read_bytes", f->read.bytes},
            {"write_ops", f->write.ops}, {"write_bytes", f->write.bytes},
            {"metadata_ops", f->metadata_ops}, {"sync_ops", f->sync_ops},
            {"other_ops", f->other_ops}, {"read_time_us", f->read.ns / 1000},
            {"write_time_us", f->write.ns / 1000}, {"metadata_time_us", f->metadata_ns / 1000},
            {"sync_time_us", f->sync_ns / 1000}, {"placed_reads", f->read.placed},
            {"seq_reads", f->read.seq}, {"consec_reads", f->read.consec},
            {"placed_writes", f->write.placed}, {"seq_writes", f->write.seq},
            {"consec_writes", f->write.consec},
            {"first_us", f->first_ns == INT64_MAX ? 0 : (f->first_ns + off) / 1000},
            {"last_us", f->last_ns ? (f->last_ns + off) / 1000 : 0},
        };
        bad |= text_put(t, head, nhead) < 0 || text_put(t, "\"fhash\":", 8) < 0 ||
               text_hash(t, f->fhash) < 0 || text_put(t, ",\"path\":", 8) < 0 ||
               (f->path ? text_json(t, f->path, strlen(f->path)) : text_put(t, "null", 4)) < 0;
        for (size_t k = 0; !bad && k < sizeof(fields) / sizeof(fields[0]); k++) {
            bad |= text_put(t, ",\"", 2) < 0 || text_put(t, fields[k].key, strlen(fields[k].key)) < 0 ||
                   text_put(t, "\":", 2) < 0 || text_int(t, fields[k].v) < 0;
        }
        for (int d = 0; !bad && d < 2; d++) {
            const int64_t *hist = d ? f->write.hist : f->read.hist;
            bad |= text_put(t, d ? ",\"write_hist\":[" : ",\"read_hist\":[", d ? 15 : 14) < 0;
            for (int b = 0; !bad && b < HIST; b++)
                bad |= (b && text_put(t, ",", 1) < 0) || text_int(t, hist[b]) < 0;
            bad |= text_put(t, "]", 1) < 0;
        }
        bad |= text_put(t, "}}\n", 3) < 0;
    }
    return bad ? -1 : 0;
}
