/* auto_hooks.h: auto_hooks.c's side, the types automatic tracing of an un-annotated
 * PyTorch program records through (AutoState, AutoCall; AutoFetches). */
#ifndef DFTRACE_AUTO_HOOKS_H
#define DFTRACE_AUTO_HOOKS_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* Ready the types and add AutoState and AutoCall to the module; -1 with an error. */
int dft_auto_hooks_add(PyObject *m);

DFT_HIDDEN_END
#endif /* DFTRACE_AUTO_HOOKS_H */
