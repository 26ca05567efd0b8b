"""The collector pause of the hot loops: it restores the collector, and a promoting pause neither leaks the young
garbage made before it nor touches an application's own frozen objects."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

from harness.process import checkout_env
from router.core.nogc import cyclic_gc_paused


class Node:
    """Something that can be in a reference cycle and be watched with a weak reference."""

    other: object = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_the_collector_is_paused_in_the_block_and_restored_after() -> None:
    for promote in (False, True):
        with cyclic_gc_paused(promote=promote):
            assert not gc.isenabled()
        assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused(promote=True):  # the application paused it: it stays paused
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_promoting_pause_moves_what_it_built_past_the_young_generations_unscanned() -> None:
    with cyclic_gc_paused(promote=True):
        young = [s["collections"] for s in gc.get_stats()]
        built = [{"_id": Node(), "n": i} for i in range(5_000)]
    after = [[i] for i in range(100)]  # fewer than a young collection waits for: none runs, unless over the 10,000
    assert [s["collections"] for s in gc.get_stats()] == young
    assert len(built) == 5_000 and len(after) == 100


def test_garbage_made_before_a_promoting_pause_is_still_collected() -> None:
    gc.collect()
    before = cycle()  # young cyclic garbage: collected before the promotion, not moved out of reach
    with cyclic_gc_paused(promote=True):
        pass
    assert before() is None


def test_garbage_made_in_a_promoting_pause_goes_with_the_next_full_collection() -> None:
    with cyclic_gc_paused(promote=True):
        inside = cycle()
    gc.collect()
    assert inside() is None


def test_an_applications_frozen_objects_stay_frozen() -> None:
    """In a fresh interpreter: a test worker has other threads that pause and promote at any moment, and a promotion
    that has checked the freeze count just before the application's ``gc.freeze()`` still unfreezes (see the
    module's docstring)."""
    script = textwrap.dedent("""
        import gc
        from router.core.nogc import cyclic_gc_paused
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with cyclic_gc_paused(promote=True):
            kept = [{"n": [i]} for i in range(2_000)]
        assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
        print("frozen kept")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=checkout_env())
    assert done.returncode == 0 and done.stdout.strip() == "frozen kept", done.stderr[-2000:]


def test_an_inner_pause_leaves_the_promotion_to_the_outer_one() -> None:
    with cyclic_gc_paused():
        with cyclic_gc_paused(promote=True):
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one restored what it found: paused
    assert gc.isenabled()
