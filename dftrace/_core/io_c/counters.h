/* counters.h: each file's counters, Darshan's kind (counters.c): kept by the drain
 * for every call it reads, whatever is written of the calls themselves, and written
 * as io_file records. At most IO_FILES_MAX files are counted at a time: when one
 * more comes, the counters held are written and counting starts afresh, so that a
 * process that reads millions of files holds a bounded table. A file may then have
 * several io_file records, which add up (the sums, the histograms; first and last
 * are the least and the greatest); a file read across the cut has its next call
 * counted as the first since its open (neither sequential nor random). */
#ifndef DFTRACE_IO_COUNTERS_H
#define DFTRACE_IO_COUNTERS_H

#include "io.h"

#define IO_FILES_MAX 4096 /* files counted at a time: about 1.5 MB */
#define HIST 10

/* One direction's counters (reads, or writes). `placed`: the calls that moved bytes
   at a known offset after another such call since the file was last opened (the
   ones an access pattern is about), of which `seq` started past that call's offset
   and `consec` right at its end. */
typedef struct {
    int64_t ops, bytes, ns, placed, seq, consec;
    int64_t last_off, last_end; /* of that call; -1: none since the open */
    int64_t hist[HIST];
} flow_t;

typedef struct {
    uint64_t fhash;
    char *path; /* NULL until an open names it */
    flow_t read, write;
    int64_t metadata_ops, sync_ops, other_ops, metadata_ns, sync_ns;
    int64_t first_ns, last_ns;
} file_t;

void io_counters_init(void);
/* The counters of the file `fhash`, made when it has none; NULL when IO_FILES_MAX
   files are counted already (io_counters_full()) or memory ran out. The file of the
   last call (the next one's, often) is found here, inline; the others in the table. */
extern file_t *io_last_file;
file_t *io_counters_find(uint64_t fhash);
static inline file_t *io_counters_file(uint64_t fhash) {
    return io_last_file && io_last_file->fhash == fhash ? io_last_file : io_counters_find(fhash);
}
int io_counters_full(void);
/* Each counted file's io_file record appended to `t`: `head` the line up to its
   args' first field, times in us on the trace's clock (CLOCK_MONOTONIC + off). 0, or
   -1 when memory ran out. */
int io_counters_lines(text_t *t, long long off, const char *head, size_t nhead);
/* Count afresh (after the lines were written, and in a forked child). */
void io_counters_forget(void);

/* -- counting one call -- */

/* What each call counts as (a table: one load per call); metadata unless named. */
enum { K_METADATA, K_READ, K_WRITE, K_SYNC, K_OTHER };
extern const uint8_t io_kind_of[OP_COUNT];
/* The size bucket of 2^l, by l (counters.c). */
extern uint8_t io_bucket_of_log2[64];
extern const int64_t io_bucket_tops[HIST];

static inline int io_bucket(int64_t n) { /* n > 0 */
    int b = io_bucket_of_log2[63 - __builtin_clzll((unsigned long long)n)];
    return b + (n >= io_bucket_tops[b]); /* the last top: none is past it */
}

/* A read or a write: its ops, time, bytes and size bucket, and whether it starts
   where the last one ended (consecutive) or after where it started (sequential). */
static inline void io_count_flow(flow_t *d, const io_rec_t *r) {
    d->ops++;
    d->ns += r->dur;
    if (r->ret <= 0)
        return;
    d->bytes += r->ret;
    d->hist[io_bucket(r->ret)]++;
    if (r->offset < 0)
        return;
    if (d->last_end >= 0) {
        d->placed++;
        d->consec += r->offset == d->last_end;
        d->seq += r->offset > d->last_off;
    }
    d->last_off = r->offset;
    d->last_end = r->offset + r->ret;
}

static inline void io_count(file_t *f, const io_rec_t *r) {
    int64_t end = r->t0 + r->dur;
    if (r->t0 < f->first_ns)
        f->first_ns = r->t0;
    if (end > f->last_ns)
        f->last_ns = end;
    int kind = io_kind_of[r->op];
    if (kind == K_READ) { /* the most frequent first */
        io_count_flow(&f->read, r);
    } else if (kind == K_WRITE) {
        io_count_flow(&f->write, r);
    } else if (kind == K_METADATA) {
        f->metadata_ops++;
        f->metadata_ns += r->dur;
        if (r->op == OP_OPEN || r->op == OP_OPENAT || r->op == OP_CREAT || r->op == OP_FOPEN)
            f->read.last_off = f->read.last_end = f->write.last_off = f->write.last_end = -1;
    } else if (kind == K_SYNC) {
        f->sync_ops++;
        f->sync_ns += r->dur;
    } else {
        f->other_ops++;
    }
}

#endif
