"""With XLA devices as threads, each device's entry starts from empty states, whatever ran on its thread.

torch_xla.launch runs the devices' functions on a thread pool, which may run the second device's
function on the thread the first finished on; the first device's PartialState was then taken by the
second (both rank 0 on xla:0). The real launches run in tests/xla (the TPU notebook's failing-core cell);
this checks the states' side without torch_xla.
"""

from __future__ import annotations

import threading

from accel_nb.state import AcceleratorState, GradientState, PartialState
from accel_nb.xla import runtime


def test_fresh_thread_state_empties_every_state_of_this_thread_only(monkeypatch):
    monkeypatch.setattr(runtime, "_THREADED", True)
    stores = [PartialState._shared_state, AcceleratorState._shared_state, GradientState._shared_state]
    for i, store in enumerate(stores):
        store.update(initialized=True, process_index=i)  # what the previous device left on this thread
    other = {}

    def elsewhere():
        PartialState._shared_state.update(initialized=True, process_index=7)
        other["before"] = dict(PartialState._shared_state)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    runtime.fresh_thread_state()
    assert [
        dict(s)
        for s in (PartialState._shared_state, AcceleratorState._shared_state, GradientState._shared_state)
    ] == [{}, {}, {}]
    assert other["before"] == {"initialized": True, "process_index": 7}  # another thread's state is its own
