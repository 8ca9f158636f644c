"""Exchanging two folders' names in one atomic step, where the system offers it: Linux's
``renameat2(RENAME_EXCHANGE)`` and macOS's ``renamex_np(RENAME_SWAP)``, called through
ctypes (Python's ``os`` has neither).

Why an exchange: replacing a folder that exists with plain renames takes two of them (the
old one away, the new one in), and a kill between them leaves no folder under the name at
all. After an exchange the name holds the new folder and the new folder's name the old one,
so a reader of the name finds one whole folder at every moment, and the old one is deleted
after. A symlink replaced with ``os.replace`` would be atomic on every POSIX file system
too, but it makes ``best_checkpoint/`` a link, which ``mv`` or ``cp -r`` of that folder
alone turn into a dangling one: the folder users take away stays a plain folder.

Where the call is missing (Windows, an old C library) or the file system refuses it (NFS,
CIFS, most cluster file systems), :func:`exchange` says so and changes nothing; the caller
falls back to two renames.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

_AT_FDCWD = -100  # <fcntl.h>: paths relative to the working directory
_RENAME_EXCHANGE = 2  # <linux/fs.h>
_RENAME_SWAP = 2  # macOS <stdio.h>
# What a system or file system without the exchange answers (EPERM: a container's seccomp
# filter that does not know the call; a real permission problem fails the renames after too).
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}


def _system_exchange() -> Callable[[bytes, bytes], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # Windows has no C library to load by that name
        return None
    if sys.platform.startswith("linux"):
        renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28, musl 1.2.3
        if renameat2 is None:
            return None
        renameat2.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        renameat2.restype = ctypes.c_int
        return lambda a, b: int(renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE))
    if sys.platform == "darwin":
        renamex_np = getattr(libc, "renamex_np", None)
        if renamex_np is None:
            return None
        renamex_np.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        renamex_np.restype = ctypes.c_int
        return lambda a, b: int(renamex_np(a, b, _RENAME_SWAP))
    return None


_EXCHANGE = _system_exchange()


def exchange(a: Path, b: Path) -> bool:
    """Swap the names of the existing folders ``a`` and ``b`` (in the same folder) in one
    atomic step. False, with nothing changed, where the system or the file system cannot;
    any other failure raises ``OSError``."""
    if _EXCHANGE is None:
        return False
    if _EXCHANGE(os.fsencode(a), os.fsencode(b)) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))
