"""gunicorn settings for the test servers: workers die with their master.

servers.py has the kernel kill each gunicorn master when servers.py dies (PR_SET_PDEATHSIG), but
that setting is not inherited across fork, and a sync worker whose master vanished keeps serving
its socket; so each worker asks for the same on its own.
"""
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def post_fork(server, worker):  # noqa: ARG001 (gunicorn's hook signature)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
