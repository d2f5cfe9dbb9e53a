"""The adapters package itself: each adapter says why it is unavailable, and the shared
priority index refuses what it cannot index (framework-specific checks: test_adapters_*.py)."""

import builtins
import importlib
import sys

import numpy as np
import pytest

from replaybench.adapters import FRAMEWORKS, availability
from replaybench.adapters._core import PriorityIndex


@pytest.mark.parametrize("adapter", sorted(FRAMEWORKS))
def test_missing_framework_is_an_import_error_naming_the_extra(adapter, monkeypatch):
    framework = FRAMEWORKS[adapter][0]
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == framework or name.startswith(framework + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.delitem(sys.modules, f"replaybench.adapters.{adapter}", raising=False)
    monkeypatch.setattr(builtins, "__import__", refuse)
    monkeypatch.setattr(importlib, "import_module", lambda name, package=None: refuse(name))
    with pytest.raises(ImportError, match=rf"pip install 'replaybench\[{FRAMEWORKS[adapter][2]}\]'"):
        exec(compile(f"import replaybench.adapters.{adapter}", "<test>", "exec"), {})
    ok, reason = availability(adapter)[adapter]
    assert not ok and f"replaybench[{FRAMEWORKS[adapter][2]}]" in reason and framework in reason


def test_priority_index_refuses_a_variant_without_priorities():
    with pytest.raises(ValueError, match="variant 'uniform' keeps no priorities"):
        PriorityIndex("uniform", 8)
    with pytest.raises(KeyError, match="unknown variant 'nope'"):
        PriorityIndex("nope", 8)
    with pytest.raises(ValueError, match="alpha must be"):
        PriorityIndex("binary", 8, alpha=-1)


def test_priority_index_marks_samples_and_weights():
    index = PriorityIndex("kary-aligned", 8, alpha=0.5, beta=0.5, eps=0.0, seed=0)
    index.mark_new([0, 1, 2])
    index.update([1], [16.0], n_valid=3)           # p = 4: the new maximum
    index.mark_new([3])
    assert np.allclose(index.tree.get(np.arange(4)), [1, 4, 1, 4])
    idx, w = index.sample(1000)
    assert set(idx.tolist()) <= {0, 1, 2, 3}
    assert np.allclose(w, np.where(np.isin(idx, [1, 3]), 4 ** -0.5, 1.0))
    with pytest.raises(IndexError, match=r"indices\[0\] = 8 is out of range"):
        index.mark_new([8])
    with pytest.raises(ValueError, match="is not finite"):
        index.update([0], [np.nan], n_valid=4)
    index.clear()
    with pytest.raises(ValueError, match="nothing is stored or all stored priorities are 0"):
        index.sample(1)


@pytest.mark.parametrize("variant", ["kary-aligned", "binary", "kary-prefix"])
def test_priority_index_stored_and_weights_read_the_trees_leaves_once_checked(variant):
    index = PriorityIndex(variant, 8, alpha=1.0, beta=0.5, eps=0.0, seed=0)
    index.mark_new(np.arange(6))
    index.update([1, 4], [4.0, 0.25], n_valid=6)
    slots = np.array([4, 1, 0, 1, 5, 7])                 # repeats, and slot 7 never written (priority 0)
    assert np.array_equal(index.stored(slots), index.tree.get(slots))
    assert np.array_equal(index.stored([3]), [1.0]) and index.stored(np.array([], np.int64)).shape == (0,)
    with np.errstate(divide="raise"):                     # weights hides the division by a 0 priority
        got = index.weights(slots)
    with np.errstate(divide="ignore"):
        assert np.array_equal(got, np.power(index.tree.get(slots) / 0.25, -0.5)) and got[-1] == np.inf
    for bad, at in (([0, 8], 1), ([-1], 0), (np.array([3, 2, 9, -4]), 2)):
        with pytest.raises(IndexError, match=rf"indices\[{at}\] = {bad[at]} is out of range: valid slots are 0 .. 7"):
            index.stored(bad)


@pytest.mark.parametrize("variant", ["kary-aligned", "binary"])
@pytest.mark.parametrize("make", [lambda v: v.astype(np.float32), lambda v: v,                 # the compiled path
                                  lambda v: v.reshape(-1, 1), lambda v: v[::-1].copy()[::-1],   # 2-D, strided
                                  lambda v: np.round(v).astype(np.int64)])                      # ints: NumPy's path
def test_priority_index_update_abs_is_update_of_the_magnitudes(variant, make):
    rng = np.random.default_rng(3)
    fast, slow = (PriorityIndex(variant, 64, alpha=0.6, beta=0.4, eps=1e-6, seed=0) for _ in range(2))
    for index in (fast, slow):
        index.mark_new(np.arange(40))
    for _ in range(5):
        slots = rng.choice(40, 16, replace=False).astype(np.int64)
        td = make(rng.normal(0, 4, 16))
        fast.update_abs(slots, td, n_valid=40)
        slow.update(slots, np.abs(np.asarray(td).reshape(-1), dtype=np.float64), n_valid=40)
        assert np.array_equal(fast.tree.leaves(), slow.tree.leaves())
        assert fast.tree.total() == slow.tree.total() and fast.tree.min() == slow.tree.min()
        assert fast.max_priority == slow.max_priority
    before = fast.tree.leaves().copy()
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan is not finite"):
        fast.update_abs(np.array([0, 1], np.int64), np.array([1.0, np.nan], np.float32), n_valid=40)
    with pytest.raises(IndexError, match=r"40"):
        fast.update_abs(np.array([0, 40], np.int64), np.array([1.0, 2.0]), n_valid=40)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        fast.update_abs(np.array([0, 1], np.int64), np.ones(3), n_valid=40)
    assert np.array_equal(fast.tree.leaves(), before)


def test_priority_index_says_whether_it_is_empty_or_its_priorities_are_all_zero():
    index = PriorityIndex("binary", 8, eps=0.0, seed=0)
    with pytest.raises(ValueError, match=r"cannot sample batch_size=4 from an empty buffer"):
        index.sample(4, n_valid=0)
    index.mark_new([0, 1, 2])
    index.update([0, 1, 2], [0.0, 0.0, 0.0], n_valid=3)     # zero TD errors with eps=0: priority 0
    with pytest.raises(ValueError, match=r"all 3 stored priorities are 0 \(eps=0\.0") as err:
        index.sample(4, n_valid=3)
    assert "empty" not in str(err.value)


@pytest.mark.parametrize("values, shown", [(["1.0", "x"], r"td\[0\] = '1\.0'"),
                                           (np.array([1.0, 2 + 1j]), r"td\[1\] = \(2\+1j\)"),
                                           ([1.0, None], r"td\[1\] = None")])
def test_real_array_names_the_first_value_that_is_not_a_real_number(values, shown):
    import torch

    from replaybench.adapters._core import real_array

    with pytest.raises(TypeError, match=rf"td must be numbers, got dtype \S+: {shown} is not a real number"):
        real_array(values, "td")
    with pytest.raises(TypeError, match=r"td\[1\] = \(2\+1j\) is not a real number"):
        real_array(torch.tensor([1.0, 2 + 1j]), "td")
    column = torch.arange(3, dtype=torch.bfloat16).reshape(3, 1)
    assert np.array_equal(real_array(column, "td"), [[0.0], [1.0], [2.0]])   # no NumPy bfloat16: widened
