"""Continue the data streams of a checkpoint on another number of ranks, without repeating or dropping data.

A training loader of rank r of W (`albert_dist.data.loader.build_train_loader(cfg, micro, r, W)`) is one
deterministic *stream* of batches; its `state_dict()` is a position in that stream, and it can only be
resumed as rank r of W (its shard split depends on both). A checkpoint written by W ranks therefore holds W
stream positions. When the job resumes on W' != W ranks, the rule is:

* the W' new ranks keep reading the **old streams**, each from its saved position (a loader is built as
  "rank i of W" in whichever process takes stream i; nothing about the old split changes);
* W' <= number of streams S: new rank r takes the whole streams i with i % W' == r and reads them in turn,
  one batch from each (2 -> 1: rank 0 alternates between stream 0 and stream 1);
* W' > S: stream i is shared by the k new ranks r with r % S == i; the j-th of them (j = r // S) takes the
  batches j, j+k, j+2k, ... of the stream from its saved position (2 -> 4: ranks 0 and 2 split stream 0 into
  even and odd batches). Each sharer generates and skips the batches of the others, so data loading costs k
  times more (the price of not re-splitting the corpus; a later resume on W ranks restores the native layout);
* the union of what the new ranks read is exactly the continuation of every old stream: no batch is read twice
  and none is skipped. Every new rank still yields one batch per micro-step.

The state of such a loader (`ReshardedLoader.state_dict()`) records its member streams and positions, so it
resumes exactly on W' ranks and can be re-mapped again; `collect_streams` turns any checkpoint's per-rank states
back into the list of streams (for a shared stream, the position of its most advanced sharer, which is the
stream's true position since sharers advance in lock-step).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from albert_dist.data.loader import next_batch

#: Key that marks a `ReshardedLoader` state among the per-rank states of a checkpoint.
RESHARDED_KEY = "albert_dist_resharded"

LoaderFactory = Callable[[int, int], Any]
"""(base_rank, base_world_size) -> a fresh resumable training loader of that rank (state_dict/load_state_dict)."""


@dataclass
class Stream:
    """One old rank's batch stream: built as rank `rank` of `world`, positioned by `state`."""

    rank: int
    """Rank the stream's loader is built for."""
    world: int
    """World size the stream's loader is built for."""
    state: Any
    """The loader's state_dict() at the stream's position (None: the beginning)."""


def collect_streams(states: list[Any]) -> list[Stream]:
    """The streams of a checkpoint from its per-rank data states (index = rank that saved it), sorted by
    (world, rank). Native states are stream (r, len(states)); resharded ones contribute their members, a shared
    stream once, at the position of its sharer with the largest offset."""
    streams: dict[tuple[int, int], tuple[int, Stream]] = {}
    for saved_rank, state in enumerate(states):
        if isinstance(state, dict) and state.get(RESHARDED_KEY):
            for m in state["members"]:
                key = (m["world"], m["rank"])
                if key not in streams or m["offset"] > streams[key][0]:
                    streams[key] = (m["offset"], Stream(m["rank"], m["world"], copy.deepcopy(m["state"])))
        else:
            key = (len(states), saved_rank)
            streams[key] = (0, Stream(saved_rank, len(states), copy.deepcopy(state)))
    return [stream for _, (_, stream) in sorted(streams.items())]


def assign(num_streams: int, world_size: int, rank: int) -> list[tuple[int, int, int]]:
    """The (stream index, stride, offset) triples new rank `rank` of `world_size` reads (see the module rule).

    Raises `ValueError` when there is no stream or `rank` is out of range.
    """
    if num_streams < 1:
        raise ValueError(f"no data stream to continue (num_streams={num_streams})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if world_size <= num_streams:
        return [(i, 1, 0) for i in range(num_streams) if i % world_size == rank]
    stream = rank % num_streams
    stride = len(range(stream, world_size, num_streams))
    return [(stream, stride, rank // num_streams)]


class ReshardedLoader:
    """Batches of one new rank reading old streams by the module's rule; `state_dict`/`load_state_dict` like a
    StatefulDataLoader. Built by `build_resumed_loader`."""

    def __init__(self, factory: LoaderFactory, members: list[dict]):
        self._members = members  # dicts: rank, world, stride, offset, taken, state
        self._loaders = []
        for m in members:
            loader = factory(m["rank"], m["world"])
            if m["state"] is not None:
                loader.load_state_dict(m["state"])
            self._loaders.append(loader)
        self._turn = 0
        self._iters: Optional[list[Iterator]] = None

    def __iter__(self) -> Iterator[dict]:
        if self._iters is None:
            self._iters = [iter(loader) for loader in self._loaders]
        while True:
            i = self._turn
            m, it = self._members[i], self._iters[i]
            # The sharer j of k takes batches j, j+k, ...: skip j before its first take, k-1 before the others.
            for _ in range(m["offset"] if m["taken"] == 0 else m["stride"] - 1):
                next_batch(it)  # a stream that gave up on the object store raises here too
            batch = next_batch(it)
            m["taken"] += 1
            self._turn = (i + 1) % len(self._members)
            yield batch

    def iterators(self) -> list[Iterator]:
        """The member loaders' live iterators (empty before iteration), e.g. to shut their workers down."""
        return list(self._iters or [])

    def state_dict(self) -> dict:
        """Members (stream, stride, offset, batches taken, loader position) and whose turn is next."""
        members = copy.deepcopy(self._members)
        if self._iters is not None:  # positions moved since they were loaded
            for m, loader in zip(members, self._loaders):
                m["state"] = loader.state_dict()
        return {RESHARDED_KEY: 1, "members": members, "turn": self._turn}

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()` of a loader with the same members (same world size)."""
        mine = [(m["rank"], m["world"], m["stride"], m["offset"]) for m in self._members]
        theirs = [(m["rank"], m["world"], m["stride"], m["offset"]) for m in state["members"]]
        if mine != theirs:
            raise ValueError(f"resharded loader state is for streams {theirs}, this loader reads {mine}")
        self._members = copy.deepcopy(state["members"])
        for loader, m in zip(self._loaders, self._members):
            if m["state"] is not None:
                loader.load_state_dict(m["state"])
        self._turn = int(state["turn"])
        self._iters = None


def build_resumed_loader(factory: LoaderFactory, saved_states: Optional[list[Any]], world_size: int, rank: int):
    """The training loader of rank `rank` of `world_size`, continuing `saved_states` (a checkpoint's per-rank
    data states; None: a fresh start).

    * None, or the same world size: `factory(rank, world_size)` (or the saved `ReshardedLoader` layout) with
      `saved_states[rank]` loaded, which resumes exactly.
    * Another world size: if the streams are exactly "rank r of world_size" for every r, the native loaders
      (e.g. 2 -> 4 -> 2); otherwise a `ReshardedLoader` by the module's rule.
    """
    if saved_states is None:
        return factory(rank, world_size)
    if len(saved_states) == world_size:
        state = saved_states[rank]
        if isinstance(state, dict) and state.get(RESHARDED_KEY):
            loader = ReshardedLoader(factory, copy.deepcopy(state["members"]))
            loader.load_state_dict(state)
            return loader
        loader = factory(rank, world_size)
        if state is not None:
            loader.load_state_dict(state)
        return loader
    streams = collect_streams(saved_states)
    if [(s.rank, s.world) for s in streams] == [(r, world_size) for r in range(world_size)]:
        loader = factory(rank, world_size)
        if streams[rank].state is not None:
            loader.load_state_dict(streams[rank].state)
        return loader
    members = [{"rank": streams[i].rank, "world": streams[i].world, "stride": stride, "offset": offset,
                "taken": 0, "state": streams[i].state}
               for i, stride, offset in assign(len(streams), world_size, rank)]
    return ReshardedLoader(factory, members)
