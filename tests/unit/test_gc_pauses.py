"""The server's garbage-collector timing (observe/gc_pauses.py) must never stop the thread that
reads it: a collection can start inside the status read itself."""

import gc
import threading
from collections import deque

from gpustack_dspark.observe.gc_pauses import GcPauses


def test_a_collection_that_starts_inside_a_status_read_does_not_freeze_the_thread():
    pauses = GcPauses()

    class CollectingDeque(deque):
        def __iter__(self):
            gc.collect()  # as any allocation in snapshot() can: the callback runs right here
            return super().__iter__()

    pauses.recent_full = CollectingDeque(maxlen=64)
    done = []
    pauses.install()
    try:
        reader = threading.Thread(target=lambda: done.append(pauses.snapshot()), daemon=True)
        reader.start()
        reader.join(10)
    finally:
        gc.callbacks.remove(pauses._callback)  # a stuck reader must not take later collections with it
    assert not reader.is_alive() and done, "snapshot() froze its thread (the GC callback waited on its lock)"
    assert pauses.by_generation[2]["count"] >= 1  # the collection inside the read was timed
    assert done[0]["timed"] and set(done[0]["collections"]) == {"0", "1", "2"}
