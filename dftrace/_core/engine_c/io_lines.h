/* io_lines.h: io_lines.c's side, the engine's end of a file-I/O drain (io_sink.h). */
#ifndef DFTRACE_IO_LINES_H
#define DFTRACE_IO_LINES_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* The module's functions of io_lines.c (io_sink). */
extern PyMethodDef dft_io_lines_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_IO_LINES_H */
