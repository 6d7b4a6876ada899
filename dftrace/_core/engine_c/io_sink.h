/* io_sink.h: what the two C modules share about file I/O: the record of a call in the
 * interposer's ring, and the engine's side of a drain. dftrace._core._io's drain()
 * reads the ring and hands each call to record(); the engine keeps it as a record of
 * the trace with the call's values raw, and the writer makes its line. The engine hands the table out as a
 * capsule (_speedups.io_sink()). Plain C: no Python, no engine header. */
#ifndef DFTRACE_IO_SINK_H
#define DFTRACE_IO_SINK_H

#include <stdint.h>

#define DFT_IO_SINK_CAPSULE "dftrace._core._speedups.io_sink"

/* One call as the interposer's wrappers record it in their ring: 64 bytes, one slot.
   A call that names a path (open, stat, rename ...) is followed by the path's bytes
   in `npath` bytes of the next slots. `seq` is written last: the slot's number + 1
   once complete. */
typedef struct {
    uint64_t seq;
    int64_t t0;     /* CLOCK_MONOTONIC, ns */
    int64_t dur;    /* ns */
    uint64_t fhash; /* the file's path hash; 0: none */
    int64_t ret;    /* the bytes done, or the result; -1: failed (fopen: 0, or -1 for NULL) */
    int64_t count;  /* bytes asked; -1: none */
    int64_t offset; /* -1: unknown */
    uint32_t tid;
    uint8_t op;
    uint8_t err;    /* errno when it failed (255 when larger) */
    uint16_t npath;
} dft_io_call_t;

typedef char dft_io_call_is_64_bytes[sizeof(dft_io_call_t) == 64 ? 1 : -1];

/* A call's values kept with its record (the record's args, 24 bytes, raw): the
   bytes done (or -1), the offset it ran at (-1: none), and, for an aggregate of
   the calls over the rate cap, the calls it covers (0: one call of its own). */
typedef struct {
    int64_t ret, offset;
    uint64_t calls;
} dft_io_args_t;

typedef char dft_io_args_is_24_bytes[sizeof(dft_io_args_t) == 24 ? 1 : -1];

typedef struct {
    /* Calls [0, n): `kid_of[op]` the kind of each call's name (UINT32_MAX: none, the
       call not kept); `ncalls` NULL, or for aggregates the calls each one covers.
       Returns how many were kept (the others: the buffer at its limit, no memory,
       no kind). Holding the GIL. */
    size_t (*record)(const uint32_t kid_of[256], const dft_io_call_t *const *calls,
                     const uint64_t *ncalls, size_t n);
    /* After a drain's calls: the ones not kept counted as dropped, the writer woken. */
    void (*drained)(long long kept, long long dropped);
} dft_io_sink_t;

#endif /* DFTRACE_IO_SINK_H */
