"""The peak memory of a fresh interpreter, read inside it.

``getrusage(RUSAGE_SELF).ru_maxrss`` keeps, across ``exec``, the peak of the process
image that forked the child (a test process of 1 GB gives every child it starts a
1 GB "peak"); the kernel's ``VmHWM`` is the peak of the child's own address space.
:data:`PEAK_MB` is source for the child to define ``peak_mb()`` with."""

PEAK_MB = '''
def peak_mb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
'''
