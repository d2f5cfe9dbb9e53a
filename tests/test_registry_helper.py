"""replaybench.registry: the one registry shape behind every extension point."""

import pytest

from replaybench.registry import DuplicateName, Registry, UnknownName


def test_an_unknown_name_is_one_error_that_names_the_kind_and_the_known_names():
    reg = Registry("widget")
    reg.register("a", 1, origin="m")
    reg.register("b", 2, origin="m")
    with pytest.raises(UnknownName) as info:
        reg.get("c")
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    assert str(err) == "unknown widget 'c'; known: a, b" and (err.kind, err.name, err.known) == ("widget", "c", ["a", "b"])
    with pytest.raises(UnknownName):
        reg.get(["unhashable"])
    assert ["x"] not in reg and "a" in reg and list(reg) == ["a", "b"] and len(reg) == 2


def test_a_name_taken_by_another_origin_is_refused_and_the_same_origin_replaces():
    reg = Registry("widget")
    reg.register("a", 1, origin="m1")
    with pytest.raises(DuplicateName, match="'a' is already registered by m1"):
        reg.register("a", 2, origin="m2")
    reg.register("a", 3, origin="m1")
    assert reg.get("a") == 3 and reg.origin("a") == "m1"
    for bad in ("", " a", "a b", None):
        with pytest.raises(ValueError, match="widget name"):
            reg.register(bad, 0)


def test_discovery_runs_once_on_first_use_and_again_after_it_failed():
    calls = []

    def discover():
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("a module of the folder failed")
        reg.register("found", 1, origin="folder")

    reg = Registry("widget", discover)
    assert calls == []
    with pytest.raises(ImportError):
        reg.names()
    assert reg.names() == ["found"] and reg.get("found") == 1 and len(calls) == 2


def test_the_training_registries_use_it():
    from replaybench.impl.rl import ConfigError, algorithms, engines

    assert algorithms.ALGORITHMS.names() == ["a2c", "dqn", "td3"]
    assert engines.ENGINES.names() == ["dataflow", "paac", "process", "ray", "sequential"]
    with pytest.raises(ConfigError, match="unknown engine 'warp'; known: dataflow, paac"):
        engines.get("warp")
