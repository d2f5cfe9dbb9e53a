"""Gossip averaging of models between learners by point-to-point messages (GALA / PALA).

After each of its optimizer steps a learner runs one *round*: it sends a share of its model
to its out-peers of that round and adds whatever its in-peers have sent it, without waiting
for anybody unless the staleness bound says so. Messages travel through a torch.distributed
gloo process group (TCP), so the learners may sit in different processes or machines and
share no memory.

Topologies (:class:`Topology`), as in GALA's code: ``ring`` (static: ``peers=1`` sends to
rank+1, ``peers=2`` to rank+1 and rank-1) and ``exponential`` (time-varying directed
exponential graph: the offsets +1, -1, +2, -2, +4, -4, ... below the number of learners,
``peers`` of them per round, taken in turn). Every learner uses the same offsets in a given
round, so each round's graph is regular: every learner has as many in-peers as out-peers.

Mixing (:class:`GossipExchange`): weights 1 / (peers + 1). A learner that sends sends
``model / (peers + 1)`` to each out-peer and keeps the rest. To make the average of the
models hold *exactly* while messages are in flight and rounds are not aligned, each learner
carries a push-sum weight ``w`` beside its mass ``x = w * model`` (Assran et al.'s SGP; GALA,
which gossips through shared memory with read/write events, scales on the receiving side
instead): a message carries its share of ``x`` and of ``w``, the receiver adds both, and the
learner's model is ``x / w``. So ``sum(x)`` over learners and messages in flight never
changes by mixing (only by float rounding), and when rounds happen to be aligned every
``w`` stays 1 and the rule is GALA's. Every message is delivered: each learner's receiving
thread takes messages from any peer as they come and adds them up until the learner's next
round, so a slow learner never holds up a fast sender (GALA's one-slot mailbox skips a send
instead; here nothing is skipped, so nothing of the average is lost).

Staleness bound (the "process lock", ``staleness=k``): a learner keeps, for each in-peer,
how many messages that peer was due to send it by the learner's own round (by the schedule)
and how many came; when the peer is more than ``k`` messages short -- more than ``k`` rounds
behind -- the learner waits for it. ``k=0`` is synchronous gossip (each round mixes the
peers' same-numbered round); ``None`` never waits. Consensus drift is then bounded by ``k``
rounds of local updates; the price is pace: a bound on the round difference makes every
learner of a connected graph run, in the long run, at the slowest learner's rate plus a
slack of ``k`` rounds, so only ``None`` (or a ``k`` as long as the run) lets fast learners
leave a permanent straggler behind. (GALA's ``sync_freq`` bounds instead the learner's
rounds since its last message, the age of the peer's model it mixes.)

Costs per round: one scaled copy of the flat model (O(P) for P parameters) sent to each
out-peer, one add per message received; 4 * (P + 2) bytes per message. A learner waits when
it has more than 4 messages per peer queued for sending (a hung link), so memory stays bounded. Two threads per learner: one
receives (any source), one sends; the learner's own thread only scales, adds and maybe waits.

Failures: a peer whose connection closes, or that sends nothing within ``timeout_s`` while
this learner waits for it, raises :class:`PeerFailed` naming that peer's rank on this
learner's next round (or at once while waiting).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["TOPOLOGIES", "Topology", "PeerFailed", "GossipStats", "GossipExchange", "make_group",
           "consensus_distance"]

#: Topology names accepted by :class:`Topology`.
TOPOLOGIES = ("ring", "exponential")

# A message is [x share (P floats), w share, sender's round]; the round is -1 in the last
# message a learner sends each out-peer.
_GOODBYE = -1.0
_TAG = 17
_MAX_QUEUED = 4  # messages per out-peer a learner may have in its send queue before it waits


class PeerFailed(RuntimeError):
    """A gossip peer died, closed its connection or sent nothing within the timeout;
    ``rank`` is that peer's (None when the receiver cannot tell which peer failed)."""

    def __init__(self, rank: int | None, message: str):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class Topology:
    """Who sends to whom in each round, the same rule for every learner.

    ``kind``: "ring" or "exponential"; ``learners``: the number of learners (1 = nobody to
    talk to); ``peers``: out-peers per round (1 or 2). Raises ConfigError (fields "topology",
    "peers") for a combination that cannot be built, e.g. 2 peers among 2 learners.
    """

    kind: str
    learners: int
    peers: int = 1

    def __post_init__(self):
        if self.kind not in TOPOLOGIES:
            raise ConfigError("topology", self.kind, f"topology must be one of {', '.join(TOPOLOGIES)}, "
                                                     f"got {self.kind!r}")
        if self.peers not in (1, 2):
            raise ConfigError("peers", self.peers, f"peers must be 1 or 2, got {self.peers!r}")
        if self.learners < 1:
            raise ConfigError("learners", self.learners, f"learners must be >= 1, got {self.learners!r}")
        if self.learners > 1 and self.peers > len(self.offsets):
            raise ConfigError("peers", self.peers, f"{self.peers} peers per round need more than "
                                                   f"{self.learners} learners on a {self.kind} topology")

    @property
    def offsets(self) -> tuple[int, ...]:
        """The distinct rank offsets (mod learners) a learner sends to, in schedule order."""
        n = self.learners
        if n == 1:
            return ()
        if self.kind == "ring":
            candidates = [1, -1][: self.peers]
        else:
            candidates = []
            hop = 1
            while hop < n:
                candidates += [hop, -hop]
                hop *= 2
        seen, out = set(), []
        for o in candidates:
            if o % n not in seen:
                seen.add(o % n)
                out.append(o)
        return tuple(out)

    def _round_offsets(self, round_: int) -> tuple[int, ...]:
        offs = self.offsets
        if not offs:
            return ()
        return tuple(offs[(round_ * self.peers + m) % len(offs)] for m in range(self.peers))

    def out_peers(self, rank: int, round_: int) -> tuple[int, ...]:
        """The ranks ``rank`` sends to in round ``round_``."""
        return tuple((rank + o) % self.learners for o in self._round_offsets(round_))

    def in_peers(self, rank: int, round_: int) -> tuple[int, ...]:
        """The ranks that send to ``rank`` in round ``round_`` (when their round is ``round_``)."""
        return tuple((rank - o) % self.learners for o in self._round_offsets(round_))

    def all_out_peers(self, rank: int) -> tuple[int, ...]:
        """Every rank ``rank`` ever sends to."""
        return tuple(sorted({(rank + o) % self.learners for o in self.offsets}))

    def all_in_peers(self, rank: int) -> tuple[int, ...]:
        """Every rank that ever sends to ``rank``."""
        return tuple(sorted({(rank - o) % self.learners for o in self.offsets}))


@dataclass
class GossipStats:
    """What one learner's exchange did: ``rounds``; messages ``sent`` and ``received``;
    ``bytes_sent``; ``wait_s``, seconds blocked by the staleness bound (or by a full send
    queue); ``max_behind``, the most messages any in-peer was short of its due count at the
    end of a round (before waiting): how far behind the slowest peer got."""

    rounds: int = 0
    sent: int = 0
    received: int = 0
    bytes_sent: int = 0
    wait_s: float = 0.0
    max_behind: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Inbox:
    """Messages added up since the learner last mixed, guarded by ``cond``."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    x: torch.Tensor | None = None
    w: float = 0.0
    fresh: dict = field(default_factory=dict)  # rank -> messages not yet mixed in
    gone: set = field(default_factory=set)     # ranks that said goodbye
    error: PeerFailed | None = None


class GossipExchange:
    """One learner's side of the gossip: call :meth:`round` after each optimizer step and
    :meth:`finish` once at the end.

    Parameters
    ----------
    group : the gloo process group of all learners (``ProcessGroupGloo``); rank = learner index.
    topology : :class:`Topology` with ``learners == group.size()``.
    model : flat float32 tensor, this learner's initial model (copied).
    staleness : the process-lock bound ``k`` (see the module docstring), or None.
    timeout_s : how long to wait for a peer before :class:`PeerFailed`.
    describe : rank -> text used in error messages (e.g. the peer's node address).

    Thread-safety: :meth:`round` and :meth:`finish` are called from one thread.
    """

    def __init__(self, group, topology: Topology, model: torch.Tensor, *, staleness: int | None = 1,
                 timeout_s: float = 60.0, describe=str):
        if topology.learners != group.size():
            raise ConfigError("learners", topology.learners,
                              f"topology for {topology.learners} learners, process group of {group.size()}")
        if staleness is not None and staleness < 0:
            raise ConfigError("staleness", staleness, f"staleness must be >= 0 or None, got {staleness!r}")
        self.group = group
        self.rank = group.rank()
        self.topology = topology
        self.staleness = staleness
        self.timeout_s = float(timeout_s)
        self.describe = describe
        self.stats = GossipStats()
        self.x = model.detach().to(torch.float32).clone()
        self.w = 1.0
        self.n = self.x.numel()
        self._share = 1.0 / (topology.peers + 1)
        self._behind = {j: 0 for j in topology.all_in_peers(self.rank)}
        self._inbox = _Inbox()
        self._outbox: deque = deque()           # (dst, message) waiting for the sender thread
        self._out_cond = threading.Condition()
        self._closing = False
        self._receiver = threading.Thread(target=self._receive_loop, name=f"gossip-recv-{self.rank}", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name=f"gossip-send-{self.rank}", daemon=True)
        if topology.offsets:
            self._receiver.start()
            self._sender.start()

    # ---------------------------------------------------------------------------------- threads
    def _receive_loop(self) -> None:
        inbox, expected = self._inbox, set(self.topology.all_in_peers(self.rank))
        while inbox.gone != expected:
            buf = torch.empty(self.n + 2, dtype=torch.float32)
            work = self.group.recv_anysource([buf], _TAG)
            try:
                work.wait()
            except RuntimeError as err:
                missing = sorted(expected - inbox.gone)
                peers = ", ".join(f"rank {j} ({self.describe(j)})" for j in missing)
                failed = PeerFailed(missing[0] if len(missing) == 1 else None,
                                    f"learner {self.rank}: no gossip message from {peers} within "
                                    f"{self.timeout_s:g} s or the connection broke: {_first_line(err)}")
                with inbox.cond:
                    inbox.error = inbox.error or failed
                    inbox.cond.notify_all()
                return
            src = work.source_rank()
            with inbox.cond:
                if buf[self.n + 1].item() == _GOODBYE:
                    inbox.gone.add(src)
                else:
                    inbox.x = buf[: self.n].clone() if inbox.x is None else inbox.x.add_(buf[: self.n])
                    inbox.w += float(buf[self.n])
                    inbox.fresh[src] = inbox.fresh.get(src, 0) + 1
                    self.stats.received += 1
                inbox.cond.notify_all()

    def _send_loop(self) -> None:
        while True:
            with self._out_cond:
                while not self._outbox:
                    self._out_cond.wait()
                dst, msg = self._outbox[0]
            if msg is None:  # stop
                return
            try:
                self.group.send([msg], dst, _TAG).wait()
            except RuntimeError as err:
                failed = PeerFailed(dst, f"learner {self.rank}: sending gossip to rank {dst} "
                                         f"({self.describe(dst)}) failed: {_first_line(err)}")
                with self._inbox.cond:
                    self._inbox.error = self._inbox.error or failed
                    self._inbox.cond.notify_all()
                with self._out_cond:
                    self._out_cond.notify_all()
                return
            with self._out_cond:
                self._outbox.popleft()
                self.stats.bytes_sent += msg.numel() * msg.element_size()
                self._out_cond.notify_all()

    def _post(self, dst: int, msg: torch.Tensor | None) -> None:
        with self._out_cond:
            self._outbox.append((dst, msg))
            self._out_cond.notify_all()

    # ---------------------------------------------------------------------------------- rounds
    def round(self, model: torch.Tensor) -> torch.Tensor:
        """One gossip round for ``model`` (this learner's flat parameters after its local
        step); returns the mixed model (a new tensor). Raises PeerFailed."""
        self._check()
        self.x = model.detach().to(torch.float32) * self.w  # invariant: x = w * model
        r = self.stats.rounds
        self._send(self.topology.out_peers(self.rank, r), r)
        self._mix_in()
        self._lock(self.topology.in_peers(self.rank, r), r)
        self.stats.rounds += 1
        return self.x / self.w

    def _send(self, out_peers, r: int) -> None:
        if not out_peers:
            return
        self._drain(_MAX_QUEUED * self.topology.peers, r)
        share_x, share_w = self.x * self._share, self.w * self._share
        msg = torch.cat([share_x, torch.tensor([share_w, float(r)], dtype=torch.float32)])
        for dst in out_peers:
            self._post(dst, msg)
        kept = 1.0 - len(out_peers) * self._share
        self.x.mul_(kept)
        self.w *= kept
        self.stats.sent += len(out_peers)

    def _drain(self, limit: int, r: int) -> None:
        """Wait until at most ``limit`` messages are queued (a hung peer's link)."""
        with self._out_cond:
            if len(self._outbox) <= limit:
                return
            t0 = time.perf_counter()
            if not self._out_cond.wait_for(lambda: len(self._outbox) <= limit or self._inbox.error is not None,
                                           self.timeout_s):
                dst = self._outbox[0][0]
                raise PeerFailed(dst, f"learner {self.rank}: rank {dst} ({self.describe(dst)}) took no gossip "
                                      f"message within {self.timeout_s:g} s (round {r})")
            self.stats.wait_s += time.perf_counter() - t0
        self._check()

    def _mix_in(self) -> None:
        """Add the inbox to x and w, and count the messages per sender."""
        inbox = self._inbox
        with inbox.cond:
            got, inbox.fresh = inbox.fresh, {}
            if inbox.x is not None:
                self.x.add_(inbox.x)
                self.w += inbox.w
                inbox.x, inbox.w = None, 0.0
        for j, count in got.items():
            self._behind[j] -= count

    def _lock(self, due, r: int) -> None:
        """Count this round's due messages; wait for in-peers more than the bound behind."""
        for j in due:
            self._behind[j] += 1
            self.stats.max_behind = max(self.stats.max_behind, self._behind[j])
        for j in due:
            while (self.staleness is not None and self._behind[j] > self.staleness
                   and j not in self._inbox.gone):
                self._wait_for(j, r)

    def _wait_for(self, j: int, r: int) -> None:
        inbox = self._inbox
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        with inbox.cond:
            while j not in inbox.fresh and j not in inbox.gone and inbox.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerFailed(j, f"learner {self.rank}: no gossip message from rank {j} "
                                        f"({self.describe(j)}) within {self.timeout_s:g} s, waiting in round {r} "
                                        f"with staleness bound {self.staleness}")
                inbox.cond.wait(left)
        self.stats.wait_s += time.perf_counter() - t0
        self._check()
        self._mix_in()

    def _check(self) -> None:
        with self._inbox.cond:
            if self._inbox.error is not None:
                raise self._inbox.error

    # ---------------------------------------------------------------------------------- end
    def finish(self, model: torch.Tensor) -> torch.Tensor:
        """End the gossip for ``model`` (the learner's last parameters): say goodbye to every
        out-peer, wait until every in-peer has said goodbye and mix in all they sent.

        Afterwards ``sum(x)`` over learners equals what it was before the last round plus
        the local steps (no message is lost). Returns the final model; the sending and
        receiving threads have ended. Raises PeerFailed if a peer fails or stays silent for
        ``timeout_s`` (the threads are daemons: the process may exit).
        """
        self._check()
        self.x = model.detach().to(torch.float32) * self.w
        if not self.topology.offsets:
            return self.x / self.w
        goodbye = torch.zeros(self.n + 2, dtype=torch.float32)
        goodbye[self.n + 1] = _GOODBYE
        for dst in self.topology.all_out_peers(self.rank):
            self._post(dst, goodbye)
        self._post(-1, None)
        deadline = time.monotonic() + self.timeout_s
        inbox = self._inbox
        expected = set(self.topology.all_in_peers(self.rank))
        with inbox.cond:
            while inbox.gone != expected and inbox.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(expected - inbox.gone)
                    raise PeerFailed(missing[0], f"learner {self.rank}: rank(s) {', '.join(map(str, missing))} "
                                                 f"({', '.join(self.describe(j) for j in missing)}) did not end "
                                                 f"their gossip within {self.timeout_s:g} s")
                inbox.cond.wait(left)
        self._check()
        self._sender.join(self.timeout_s)
        self._receiver.join(self.timeout_s)
        self._check()
        self._mix_in()
        return self.x / self.w


def make_group(store, rank: int, size: int, *, host: str = "127.0.0.1", timeout_s: float = 60.0):
    """A gloo process group of ``size`` members over ``store`` whose member ``rank`` listens
    on ``host`` (its node's address: 127.0.0.2, 127.0.0.3, ... for loopback "nodes").

    Built directly rather than by ``init_process_group`` because that ignores a gloo device
    given in ``pg_options``; GLOO_SOCKET_IFNAME names an interface, not one of its addresses.
    Blocks until all ``size`` members have joined (or ``timeout_s``). Every operation of the
    group (send, receive, all-reduce) fails after ``timeout_s`` without progress.
    """
    import datetime

    from torch.distributed import ProcessGroupGloo

    opts = ProcessGroupGloo._Options()
    opts._devices = [ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return ProcessGroupGloo(store, rank, size, opts)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def consensus_distance(models) -> float:
    """Mean over learners of ||theta_i - mean theta|| (L2) for a sequence of flat models.
    Cost O(N P)."""
    stack = torch.stack([torch.as_tensor(m, dtype=torch.float64) for m in models])
    return float((stack - stack.mean(0)).norm(dim=1).mean())
