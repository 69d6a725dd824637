"""One replica's KV-event stream as a state machine: which batches to apply, when to replay, when to reset.

vLLM's publisher numbers its batches from 0 (per process) and keeps the last
`buffer_steps` of them for replay: a DEALER that sends the 8-byte start
sequence to its ROUTER gets every buffered batch from there on, then an end
marker (sequence -1). `Feed` is fed what the subscriber receives and answers
with the replays to ask for; it applies batches to the `KVIndex` in order:
  - the next sequence: applied;
  - a gap (a batch lost on the way: PUB drops past its high-water mark, or a
    reconnect): the batch is held and a replay from the first missing
    sequence asked for; batches that arrive meanwhile are held too. The
    replay fills the gap; if the replica's buffer no longer reaches back to
    it, the replica's blocks are reset and the index rebuilt from what
    follows (a prefix the replica still holds comes back when a request
    reuses it, if requests ask vLLM to announce reused blocks:
    `kv_cache_report_mode: full`);
  - a sequence at or below the last one: the publisher restarted (a new
    engine, an empty cache): reset, and start over;
  - the start (a feed made with the default `now=0.0` probes at once) or
    the first batch heard after a loss: replay from 0, to learn what the
    replica's buffer still holds;
  - a reconnect (the socket monitor saw the connection drop and come back):
    reset and replay from 0 at once. A restarted publisher numbers from 0
    again, but its first batches may be lost before the connection is back
    (ZMQ's slow joiner), and once it has published more than the gateway
    last saw, a restart cannot be told from a gap by the numbers;
  - silence: an idle replica publishes nothing, so after `idle_probe`
    seconds the feed asks for a replay from the next sequence: a live
    publisher answers at once (with any batches whose loss no later batch
    revealed); no answer within `replay_timeout` means the stream is lost:
    reset. Without a replay endpoint a stream is lost when its connection
    has been down for `lost_after` seconds (ZMTP heartbeats notice a silent
    peer's death).
A batch that does not decode resets the replica and counts as applied (a
replay would only bring the same bytes). Sans-IO: times are arguments, the
subscriber (kv_subscriber.py) does the sockets.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from streamproxy.gateway.kv_events import KVEventError, decode_batch
from streamproxy.gateway.kv_index import KVIndex


@dataclass(frozen=True)
class FeedPolicy:
    replay_timeout: float = 2.0  # a replay request's answer must progress within this (vLLM serves it within 0.1 s)
    idle_probe: float = 10.0  # silence after which the feed asks whether the publisher is still there
    lost_after: float = 15.0  # without replay: a connection down this long is a lost stream
    max_held: int = 10_000  # batches held while a replay runs (vLLM's default buffer_steps)


class Feed:
    def __init__(self, owner: str, index: KVIndex, *, replay: bool, policy: FeedPolicy | None = None, now: float = 0.0) -> None:
        self.owner = owner
        self.index = index
        self.replay = replay  # the publisher has a replay endpoint
        self.policy = policy or FeedPolicy()
        index.add(owner)
        self.last_seq: int | None = None  # the last batch applied; None: nothing known (reset)
        self.heard = now  # the last message of any kind
        self._replaying = False
        self._fresh = False  # the replay under way starts from a reset (nothing to keep)
        self._want = 0  # the next sequence the replay should bring
        self._deadline = 0.0
        self._held: deque[tuple[int, bytes]] = deque(maxlen=self.policy.max_held)
        self._suspect = False  # disconnected: a reconnect starts over
        self._resync = False  # reconnected: reset and replay from 0 when next due
        self._down_since: float | None = None
        self._gone = False  # lost, and not heard from since
        # Counters, for metrics and tests.
        self.batches = 0
        self.gaps = 0
        self.replays = 0
        self.resets = 0
        self.lost = 0
        self.decode_errors = 0
        self.skipped_events = 0
        self.last_error = ""

    # -- what the subscriber received -------------------------------------------------

    def live(self, seq: int, payload: bytes, now: float) -> int | None:
        """A batch from the PUB socket. Returns the sequence to ask a replay from, or None."""
        self.heard = now
        self._gone = False
        if self._replaying:
            self._held.append((seq, payload))
            return None
        if self._resync:
            self._resync = False
            self._reset()
        last = self.last_seq
        if last is None:
            if self.replay and seq > 0:
                self._held.append((seq, payload))
                return self._start(0, now, fresh=True)
            self._apply(seq, payload)
            return None
        if seq == last + 1:
            self._apply(seq, payload)
            return None
        if seq <= last:  # a restarted publisher
            self._reset()
            return self.live(seq, payload, now)
        self.gaps += 1
        if self.replay:
            self._held.append((seq, payload))
            return self._start(last + 1, now, fresh=False)
        self._reset()
        self._apply(seq, payload)
        return None

    def replayed(self, seq: int, payload: bytes, now: float) -> None:
        """A batch from the replay socket."""
        self.heard = now
        if not self._replaying:
            return  # left over from a replay given up on
        self._deadline = now + self.policy.replay_timeout
        if seq < self._want:
            return
        if seq > self._want and not self._fresh:  # the replica's buffer does not reach back to the gap
            self._reset()
            self._fresh = True
        self._apply(seq, payload)
        self._want = seq + 1

    def replay_end(self, now: float) -> None:
        """The replay socket's end marker."""
        self.heard = now
        if self._replaying:
            self._finish(answered=True)

    def connected(self, now: float) -> None:
        self._down_since = None
        if self._suspect:
            self._suspect, self._resync = False, True

    def disconnected(self, now: float) -> None:
        self._suspect = True
        if self._down_since is None:
            self._down_since = now

    # -- timers -----------------------------------------------------------------------

    def due(self, now: float) -> int | None:
        """Whatever is due at `now`; returns the sequence to ask a replay from (a probe), or None."""
        if self._replaying:
            if now >= self._deadline:
                self.heard = now  # (the next probe after another idle_probe, not at once)
                self._finish(answered=False)
            return None
        if self._resync:
            self._resync = False
            self._reset()
            return self._start(0, now, fresh=True) if self.replay else None
        if self._down_since is not None and now - self._down_since >= self.policy.lost_after:
            self._down_since = None
            self._lose("its connection is down")
        if self.replay and now - self.heard >= self.policy.idle_probe:
            last = self.last_seq
            return self._start(0 if last is None else last + 1, now, fresh=last is None)
        return None

    def next_deadline(self) -> float | None:
        """When `due` should be called next (None: only when a message comes)."""
        if self._replaying:
            return self._deadline
        if self._resync:
            return self.heard
        times = []
        if self.replay:
            times.append(self.heard + self.policy.idle_probe)
        if self._down_since is not None:
            times.append(self._down_since + self.policy.lost_after)
        return min(times) if times else None

    @property
    def replaying(self) -> bool:
        return self._replaying

    def close(self) -> None:
        """The replica is gone: its blocks with it."""
        self.index.drop(self.owner)

    # -- inside -----------------------------------------------------------------------

    def _start(self, start: int, now: float, *, fresh: bool) -> int:
        self._replaying, self._fresh, self._want = True, fresh, start
        self._deadline = now + self.policy.replay_timeout
        self.replays += 1
        return start

    def _finish(self, *, answered: bool) -> None:
        self._replaying = False
        held, self._held = list(self._held), deque(maxlen=self.policy.max_held)
        if not answered and not held:
            self._lose("no answer to a replay request")
            return
        self._gone = False
        for seq, payload in held:
            last = self.last_seq
            if last is not None and seq <= last:
                continue  # the replay brought it
            if last is not None and seq != last + 1:  # still missing some: the buffer did not have them
                self._reset()
            self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        try:
            batch, skipped = decode_batch(payload)
        except KVEventError as e:
            self.decode_errors += 1
            self.last_error = str(e)
            self._reset()
            self.last_seq = seq
            return
        self.batches += 1
        self.skipped_events += skipped
        self.index.apply(self.owner, batch.events)

    def _reset(self) -> None:
        self.resets += 1
        self.index.reset(self.owner)
        self.last_seq = None

    def _lose(self, why: str) -> None:
        if not self._gone:  # (counted once until it is heard from again)
            self.lost += 1
            self.resets += 1
            self.last_error = f"stream lost: {why}"
        self._gone = True
        self.index.reset(self.owner)
        self.last_seq = None
