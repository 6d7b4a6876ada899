/* signal_sender.c: the pid that sent a signal handled by a Python handler. Python's
 * handlers are not told who sent the signal; a library that ends a process at a signal
 * in C can act on it (PyTorch's DataLoader workers leave with status 0 at a SIGTERM
 * from their parent, and die of it otherwise). note_signal_sender(signum) puts a C
 * handler in front of Python's own for that signal: it keeps the sender's pid, then
 * calls Python's, which does what it always does. */
#include "signal_sender.h"

#include <signal.h>
#include <string.h>

#define SENDER_SIGNALS 65

static struct sigaction python_action[SENDER_SIGNALS];
static volatile sig_atomic_t sender[SENDER_SIGNALS];

static void keep_sender(int signum, siginfo_t *info, void *context) {
    if (signum <= 0 || signum >= SENDER_SIGNALS)
        return;
    sender[signum] = info ? (sig_atomic_t)info->si_pid : 0;
    const struct sigaction *python = &python_action[signum];
    if (python->sa_flags & SA_SIGINFO)
        python->sa_sigaction(signum, info, context);
    else if (python->sa_handler != SIG_DFL && python->sa_handler != SIG_IGN)
        python->sa_handler(signum);
}

static PyObject *note_signal_sender(PyObject *self, PyObject *arg) {
    (void)self;
    long signum = PyLong_AsLong(arg);
    if (signum == -1 && PyErr_Occurred())
        return NULL;
    if (signum <= 0 || signum >= SENDER_SIGNALS)
        Py_RETURN_FALSE;
    struct sigaction current;
    if (sigaction((int)signum, NULL, &current) != 0)
        Py_RETURN_FALSE;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == keep_sender)
        Py_RETURN_TRUE; /* in front already */
    if (!(current.sa_flags & SA_SIGINFO) &&
        (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN))
        Py_RETURN_FALSE; /* no handler to put it in front of */
    struct sigaction mine;
    memset(&mine, 0, sizeof(mine));
    mine.sa_sigaction = keep_sender;
    mine.sa_mask = current.sa_mask;
    mine.sa_flags = current.sa_flags | SA_SIGINFO;
    python_action[signum] = current;
    sender[signum] = 0;
    if (sigaction((int)signum, &mine, NULL) != 0)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

static PyObject *signal_sender(PyObject *self, PyObject *arg) {
    (void)self;
    long signum = PyLong_AsLong(arg);
    if (signum == -1 && PyErr_Occurred())
        return NULL;
    if (signum <= 0 || signum >= SENDER_SIGNALS)
        return PyLong_FromLong(0);
    return PyLong_FromLong((long)sender[signum]);
}

PyMethodDef dft_signal_sender_methods[] = {
    {"note_signal_sender", note_signal_sender, METH_O,
     "note_signal_sender(signum) -> bool: put a handler that keeps the sender's pid in front "
     "of the Python handler of signum (False where signum has none)."},
    {"signal_sender", signal_sender, METH_O,
     "signal_sender(signum) -> int: the pid that sent signum last since note_signal_sender "
     "(0: none, or not known)."},
    {NULL, NULL, 0, NULL}};
