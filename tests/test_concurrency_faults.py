"""Faults of the shared-memory buffer found by the third adversarial round (issue 41, items
8-12 and 20): bad argument types, copies and pickles of a buffer, forked children, a
creator's resolved layout, too little shared or process memory, duplicate update indices."""

import os

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl import registry
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))
    yield
    leaked = set(leaked_segments(os.getpid())) - before
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


@pytest.mark.parametrize("storage", [["rows"], ("rows",), np.array(["rows", "columns"]), 3])
def test_storage_of_another_type_is_refused_by_name(storage):
    """Item 12: a list (unhashable) used to raise ``TypeError: unhashable type: 'list'``."""
    with pytest.raises(ValueError, match=r"storage must be one of \['columns', 'rows', 'rows-packed'\]"):
        registry.create("binary", 64, FIELDS, storage=storage)
    with pytest.raises(ValueError, match="storage must be one of"):
        SharedPrioritizedBuffer.create(64, FIELDS, variant="binary", storage=storage)
