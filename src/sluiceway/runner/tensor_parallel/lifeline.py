"""A spawned rank never outlives the process that spawned it.

Two independent guards, because either alone has a gap:

- A lifeline pipe: the API process holds the only write end; when it exits for
  any reason (SIGKILL included) the kernel closes it, a daemon thread in the
  rank reads EOF and ends the process at once. If the API process is already
  gone when the rank starts, the EOF is there at once.
- `PR_SET_PDEATHSIG`: the kernel sends the rank SIGKILL when its parent (the
  multiprocessing fork server, which itself exits with the API process) dies,
  even if the rank is stuck inside a C call that holds the GIL.

SIGINT is ignored in ranks: a Ctrl-C in a terminal goes to the whole process
group, and the parent, not the rank, decides when a step may be cut short.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(lifeline: Connection) -> None:
    """Arrange for this process to end when the process holding the write end of
    `lifeline` ends, or its own parent does; ends at once if either already has."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the lifeline alone guards
        log.debug("no PR_SET_PDEATHSIG here")
    if os.getppid() == 1:
        os._exit(1)  # the parent died before the guard was set
    threading.Thread(
        target=_exit_on_eof, args=(lifeline,), name="sluiceway-tp-lifeline", daemon=True
    ).start()


def _exit_on_eof(lifeline: Connection) -> None:
    try:
        while True:
            lifeline.recv_bytes()  # the parent never writes; only EOF comes
    except (EOFError, OSError):
        pass
    os._exit(0)
