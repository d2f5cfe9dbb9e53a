"""Gossip mixing (impl/rl/gossip/exchange.py): topologies, the average kept, consensus on a ring, failures.

The exchanges run as threads of this process, each with its own gloo process group over one
in-memory store: the same sockets and threads as learners in separate processes, without
paying a process start per learner (tests/test_gossip_launch.py starts real processes).
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.gossip.exchange import GossipExchange, PeerFailed, Topology, consensus_distance, make_group


def _groups(n: int, timeout_s: float = 10.0):
    import torch.distributed as dist

    store = dist.HashStore()
    groups = [None] * n

    def join(r):
        groups[r] = make_group(dist.PrefixStore("test", store), r, n, timeout_s=timeout_s)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups


def _run(n, topology, rounds, *, staleness, models, timeout_s=10.0, stop_rank=None):
    """Each learner does ``rounds`` gossip rounds with no local update; returns per learner
    (history of models, final model, exchange, error)."""
    groups = _groups(n, timeout_s)
    out = [{"history": [], "final": None, "exchange": None, "error": None} for _ in range(n)]

    def learner(r):
        mine = out[r]
        try:
            ex = mine["exchange"] = GossipExchange(groups[r], topology, models[r], staleness=staleness,
                                                   timeout_s=timeout_s, describe=lambda j: f"thread {j}")
            z = models[r]
            for k in range(rounds):
                if r == stop_rank and k == rounds // 2:
                    return  # this learner falls silent: no more rounds, no goodbye
                z = ex.round(z)
                mine["history"].append(z)
            mine["final"] = ex.finish(z)
        except Exception as err:
            mine["error"] = err

    threads = [threading.Thread(target=learner, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a learner thread hung"
    return out


def _models(n, size=257, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) * (r + 1) + r for r in range(n)]


# ---------------------------------------------------------------------------------------- topology
def test_topologies_send_and_receive_in_a_regular_graph():
    for kind, n, peers in [("ring", 4, 1), ("ring", 5, 2), ("exponential", 8, 1), ("exponential", 8, 2),
                           ("exponential", 6, 2), ("exponential", 2, 1)]:
        topo = Topology(kind, n, peers)
        for r in range(7):
            outs = [topo.out_peers(i, r) for i in range(n)]
            for i in range(n):
                assert len(set(outs[i])) == peers and i not in outs[i]
                # j sends to i in round r exactly when j is among i's in-peers of round r
                assert sorted(topo.in_peers(i, r)) == sorted(j for j in range(n) if i in outs[j])
    assert Topology("exponential", 8, 1).offsets == (1, -1, 2, -2, 4)
    assert Topology("ring", 1, 1).offsets == ()


@pytest.mark.parametrize("kwargs, field", [({"kind": "star", "learners": 4}, "topology"),
                                           ({"kind": "ring", "learners": 4, "peers": 3}, "peers"),
                                           ({"kind": "ring", "learners": 2, "peers": 2}, "peers"),
                                           ({"kind": "ring", "learners": 0}, "learners")])
def test_bad_topology_is_refused_naming_the_argument(kwargs, field):
    with pytest.raises(ConfigError) as err:
        Topology(**kwargs)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------- mixing
@pytest.mark.parametrize("kind, n, peers, staleness, rounds", [("ring", 4, 1, 0, 13), ("exponential", 4, 2, None, 7),
                                                               ("exponential", 5, 1, 2, 30)])
def test_mixing_keeps_the_average_of_the_models(kind, n, peers, staleness, rounds):
    models = _models(n)
    out = _run(n, Topology(kind, n, peers), rounds, staleness=staleness, models=models)
    assert [o["error"] for o in out] == [None] * n
    mean0 = torch.stack(models).double().mean(0)
    exchanges = [o["exchange"] for o in out]
    # push-sum: sum(x) and sum(w) are kept by mixing; the weighted average sum(w z)/sum(w) is the average
    assert math.isclose(sum(e.w for e in exchanges), n, rel_tol=1e-5)
    mean = sum(e.w * o["final"].double() for e, o in zip(exchanges, out)) / sum(e.w for e in exchanges)
    torch.testing.assert_close(mean, mean0, rtol=1e-5, atol=1e-5)
    assert all(e.stats.rounds == rounds and e.stats.received == e.stats.sent for e in exchanges)
    # and mixing moved every model toward the average
    assert consensus_distance([o["final"] for o in out]) < 0.9 * consensus_distance(models)


def test_consensus_distance_falls_geometrically_on_a_ring():
    n, rounds = 4, 36
    models = _models(n, seed=1)
    out = _run(n, Topology("ring", n, 1), rounds, staleness=0, models=models)
    assert [o["error"] for o in out] == [None] * n
    d = [consensus_distance(models)] + [consensus_distance([o["history"][k] for o in out]) for k in range(rounds)]
    # synchronous gossip on a ring mixes by W = (I + shift) / 2: the distance shrinks by
    # |lambda_2| = cos(pi / n) ~ 0.71 per round. Asked: at least 0.85 per round in every 6-round window.
    rate = math.cos(math.pi / n)
    for k in range(0, rounds - 6, 6):
        assert d[k + 6] <= d[k] * 0.85 ** 6, (k, d[k], d[k + 6])
    assert d[rounds] <= d[0] * (rate + 0.05) ** rounds


def test_a_silent_peer_fails_the_wait_naming_its_rank():
    n = 3
    out = _run(n, Topology("ring", n, 1), 10, staleness=1, models=_models(n), timeout_s=1.5, stop_rank=1)
    # rank 2 receives from rank 1: it waits past the bound and fails naming rank 1
    err = out[2]["error"]
    assert isinstance(err, PeerFailed) and err.rank == 1
    assert "rank 1 (thread 1)" in str(err) and "within 1.5 s" in str(err)
    # every other learner ends with an error too (none hangs): no learner finishes a run a peer left
    assert all(o["error"] is not None or r == 1 for r, o in enumerate(out))
