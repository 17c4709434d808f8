"""The CPython-private calls the project makes, each pinned by a test in
``tests/test_stdlib_compat.py`` (``tests/test_private_names.py`` checks they appear nowhere else):

1. ``_signal.signal`` / ``_signal.getsignal`` (:data:`set_signal_handler`,
   :data:`get_signal_handler`): ``signal``'s C functions. ``signal.signal``/``getsignal`` are
   the same calls wrapped in enum conversions that cost ~4 µs each (the episode alarm makes
   three per env step); handlers come back as given (``SIG_DFL``/``SIG_IGN`` as plain ints) and
   go back as they came.
2. ``asyncio._get_running_loop`` / ``asyncio._set_running_loop`` (:data:`running_loop`,
   :data:`set_running_loop`): asyncio's per-thread record of the running loop (``None`` when
   none; no error), used by ``asyncio.run`` and greenlet-based libraries alike to set a loop
   aside while another runs.

They are the functions themselves (no wrapper): the callers are on the env step's hot path.
"""

from __future__ import annotations

import _signal
import asyncio
from collections.abc import Callable
from typing import Any

#: (1) ``_signal.signal(signum, handler) -> previous handler``
set_signal_handler: Callable[[int, Any], Any] = _signal.signal
#: (1) ``_signal.getsignal(signum) -> handler`` (``None``: one Python did not install)
get_signal_handler: Callable[[int], Any] = _signal.getsignal
#: (2) the running event loop of this thread, or ``None``
running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop
#: (2) set (or with ``None`` clear) this thread's running event loop
set_running_loop: Callable[[asyncio.AbstractEventLoop | None], None] = asyncio._set_running_loop

__all__ = ["get_signal_handler", "running_loop", "set_running_loop", "set_signal_handler"]
