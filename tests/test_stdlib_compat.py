"""Each CPython-private call the project makes, pinned (see :mod:`topologies.stdlib_compat`).

The numbers follow the module's docstring; a Python upgrade that changes one fails here, naming
it, before the episode alarm or the bridge's event loops misbehave.
"""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from topologies import stdlib_compat as sc

needs_alarm = pytest.mark.skipif(
    not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread(),
    reason="SIGALRM handlers are set from the main thread only",
)


@needs_alarm
def test_1_signal_c_functions_take_and_give_handlers_as_they_are() -> None:
    alarm = int(signal.SIGALRM)
    before = sc.get_signal_handler(alarm)

    def handler(signum: int, frame: object) -> None:
        pass

    try:
        previous = sc.set_signal_handler(alarm, handler)
        assert previous is before  # the old handler, as it was
        assert sc.get_signal_handler(alarm) is handler
        assert signal.getsignal(signal.SIGALRM) is handler  # the same record as signal's
        sc.set_signal_handler(alarm, int(signal.SIG_DFL))
        dfl = sc.get_signal_handler(alarm)
        assert type(dfl) is int and dfl == signal.SIG_DFL  # a plain int, no enum
    finally:
        sc.set_signal_handler(alarm, before)
    assert sc.get_signal_handler(alarm) is before


def test_2_running_loop_record_is_per_thread_and_settable() -> None:
    assert sc.running_loop() is None  # no loop running: None, no error

    async def inside() -> None:
        loop = asyncio.get_running_loop()
        assert sc.running_loop() is loop
        sc.set_running_loop(None)  # set aside (what the bridge does around a switch)
        try:
            assert sc.running_loop() is None
            with pytest.raises(RuntimeError):
                asyncio.get_running_loop()
        finally:
            sc.set_running_loop(loop)
        assert asyncio.get_running_loop() is loop

    asyncio.run(inside())
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(sc.running_loop()))
    thread.start()
    thread.join()
    assert seen == [None]
