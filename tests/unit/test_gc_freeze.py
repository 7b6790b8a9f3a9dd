"""The start-up heap frozen out of the garbage collector's full passes (lib/gc_freeze.py)."""

import gc

import pytest

from a2a_platform.lib.gc_freeze import freeze_startup_heap


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other = self


def test_what_start_up_keeps_is_frozen_and_its_garbage_is_collected_first(unfrozen):
    kept = Node()  # alive: frozen
    garbage = Node()  # a cycle nothing refers to: collected, not frozen for good
    del garbage
    freeze_startup_heap()
    assert gc.get_freeze_count() > 0
    assert not any(type(obj) is Node for obj in gc.get_objects())  # frozen: in no generation
    gc.unfreeze()
    assert [obj for obj in gc.get_objects() if type(obj) is Node] == [kept]


def test_what_is_allocated_after_the_freeze_is_collected_as_before(unfrozen):
    freeze_startup_heap()
    late = Node()
    assert late in [obj for obj in gc.get_objects() if type(obj) is Node]
    del late
    gc.collect()
    assert not [obj for obj in gc.get_objects() if type(obj) is Node]
