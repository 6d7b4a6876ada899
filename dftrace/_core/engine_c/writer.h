/* writer.h: writer.c's side, frames to the file: lines encoded, compressed (zstd,
 * libdeflate) and written without the GIL, and the writer thread's loop. */
#ifndef DFTRACE_WRITER_H
#define DFTRACE_WRITER_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* Shared with the drainer's ShmReader (shm_consumer.c). */
int dft_load_zstd(void); /* 1 when zstd can be used (loaded at the first call) */
int dft_ensure(char **buf, size_t *cap, size_t need);
#ifdef HAVE_NATIVE_WRITE
int dft_compress_write(int fd, int level, const char *src, size_t len, char **zb, size_t *zcap_,
                       size_t *written);
#endif

/* The module's functions of the writer (drain, drain_write, write_loop, ...). */
extern PyMethodDef dft_writer_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_WRITER_H */
