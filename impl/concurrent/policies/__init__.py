"""One module per concurrency policy; each registers its class with
:func:`impl.concurrent.policy.register` when :func:`impl.concurrent.policy.names` imports this folder.

================  ==============================================================================
policy            critical sections (``T`` = tree lock, ``L`` = leaf lock; order T then L)
================  ==============================================================================
global-lock       T around all of insert (data copy included), sample (data copy included), update
pal-locks         T around tree work and the data copy of inserts; L around leaf writes and
                  priority reads, so priorities are readable while inner levels are updated;
                  samples copy rows outside the lock
lazy-writing      T to reserve (priority 0) and to publish (true priority); the data copy runs
                  with no lock; samples copy rows outside the lock
optimistic        as lazy-writing, but samples take no lock at all: they validate what they
                  read (no zero leaf, stamps unchanged) and draw again otherwise
deferred          T around inserts and updates that write leaves only and queue the deltas;
                  the next sample (or a full queue) propagates them, under T
sharded           S sub-trees, each with a lock of its own; T guards the ring only (tickets and
                  in-flight records); a sample holds one shard shared at a time, an update or
                  a publish one shard at a time; copies with no lock
================  ==============================================================================

A fully lock-free policy (writers too, with atomic delta propagation; the atomics are in
:mod:`impl.concurrent.atomics`) is not offered: re-summing, the minimum tree and crash recovery
would each need a second protocol to stay correct, and the float32 drift bound could no longer
be stated per call. ``optimistic`` takes the lock-free part that is easy to prove safe: the
readers.
"""
