"""One replica's KV-event stream over ZMQ: the sockets around a `kv_feed.Feed`.

A SUB socket connects to the replica's PUB endpoint (vLLM binds it when the
endpoint has `*`, as in its default `tcp://*:5557`), or binds one the
replica's publisher connects to (`bind=True`: an endpoint without `*` makes
vLLM connect, llm-d's layout). A DEALER connects to the replica's replay
ROUTER (`replay_endpoint`, which vLLM always binds) when the feed asks for
a replay: it sends an empty delimiter and the 8-byte start sequence, and
reads the batches back (delimiter, topic, sequence, payload) until vLLM's
end marker; a replay left unfinished gets a new DEALER next time, so its
late answers are never taken for the next one's. A socket monitor tells
the feed of connects and disconnects; ZMTP heartbeats (`heartbeat`
seconds) make a dead peer a disconnect even when no FIN arrives.

One task per replica polls the three sockets and the feed's next deadline.
Messages are taken with non-blocking receives, as many as are there, and
the task yields to the loop after `budget` seconds of work, so a replay of
thousands of batches never holds the loop; decoding (msgspec) and the
index update cost about 30 µs a batch of a few events, 1 µs a block
(bench/kv_cost.py), and run only here, never per token. A message that
is not three frames with an 8-byte sequence is counted and dropped. pyzmq
is imported only here, when a subscriber starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from streamproxy.gateway.kv_events import END_SEQ, KVEventError, split_message
from streamproxy.gateway.kv_feed import Feed

if TYPE_CHECKING:
    import zmq
    import zmq.asyncio

log = logging.getLogger("streamproxy.gateway.kv_events")

RETRY_DELAY = 1.0  # after a socket error (an endpoint that does not resolve, a port taken), before trying again


class KVSubscriber:
    def __init__(self, feed: Feed, endpoint: str, *, replay_endpoint: str | None = None, topic: str = "",
                 bind: bool = False, heartbeat: float = 5.0, budget: float = 0.002) -> None:
        self.feed = feed
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.bind = bind
        self.heartbeat = heartbeat
        self.budget = budget
        self.connected = False
        self.malformed = 0  # messages that were not KV-event frames
        self._task: asyncio.Task[None] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_done = True  # the last replay asked for ended with its end marker
        self._poller: zmq.asyncio.Poller | None = None

    @property
    def started(self) -> bool:
        """`start` ran and `stop` did not since."""
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"kv-events-{self.feed.owner}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def run(self) -> None:
        import zmq

        while True:
            try:
                await self._session()
            except zmq.ZMQError as e:
                self.connected = False
                self.feed.disconnected(time.monotonic())
                log.warning("KV events of %s at %s: %s; trying again in %.0f s", self.feed.owner, self.endpoint, e, RETRY_DELAY)
                await asyncio.sleep(RETRY_DELAY)

    async def _session(self) -> None:
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        monitor: zmq.asyncio.Socket | None = None
        poller = self._poller = zmq.asyncio.Poller()
        try:
            self._configure(sub)
            monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            if self.bind:
                sub.bind(self.endpoint)
            else:
                sub.connect(self.endpoint)
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            raw_sub: zmq.Socket[Any] = zmq.Socket.shadow(sub.underlying)
            raw_monitor: zmq.Socket[Any] = zmq.Socket.shadow(monitor.underlying)
            while True:
                ready = dict(await poller.poll(self._timeout_ms()))
                if monitor in ready:
                    self._monitor_events(raw_monitor)
                if sub in ready:
                    await self._drain(raw_sub, self._live)
                replay = self._replay
                if replay is not None and replay in ready:
                    await self._drain(zmq.Socket.shadow(replay.underlying), self._replayed)
                start = self.feed.due(time.monotonic())
                if start is not None:
                    self._ask(start)
        finally:
            self.connected = False
            self._poller = None
            if self._replay is not None:
                self._replay.close(linger=0)
                self._replay, self._replay_done = None, True
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)

    def _configure(self, sub: zmq.asyncio.Socket) -> None:
        import zmq

        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.setsockopt(zmq.RCVHWM, 100_000)  # vLLM's PUB high-water mark
        sub.setsockopt(zmq.RECONNECT_IVL, 200)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        if self.heartbeat > 0:
            ivl = int(self.heartbeat * 1000)
            sub.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)

    def _timeout_ms(self) -> float | None:
        deadline = self.feed.next_deadline()
        return None if deadline is None else max(0.0, (deadline - time.monotonic()) * 1000)

    async def _drain(self, socket: zmq.Socket[Any], handle: Any) -> None:
        """Every message waiting on `socket`, yielding to the loop after each `budget` of work."""
        import zmq

        began = time.monotonic()
        while True:
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handle(frames)
            if time.monotonic() - began > self.budget:
                await asyncio.sleep(0)
                began = time.monotonic()

    def _live(self, frames: list[bytes]) -> None:
        try:
            _, seq, payload = split_message(frames)
        except KVEventError as e:
            self._malformed(e)
            return
        self.connected = True
        start = self.feed.live(seq, payload, time.monotonic())
        if start is not None:
            self._ask(start)

    def _replayed(self, frames: list[bytes]) -> None:
        if frames and frames[0] == b"":
            frames = frames[1:]  # (the ROUTER's delimiter)
        if len(frames) == 3 and frames[1] == END_SEQ:
            self._replay_done = True
            self.feed.replay_end(time.monotonic())
            return
        try:
            _, seq, payload = split_message(frames)
        except KVEventError as e:
            self._malformed(e)
            return
        self.feed.replayed(seq, payload, time.monotonic())

    def _malformed(self, error: KVEventError) -> None:
        self.malformed += 1
        if self.malformed == 1 or self.malformed % 1000 == 0:
            log.warning("KV events of %s: %s (%d such messages)", self.feed.owner, error, self.malformed)

    def _monitor_events(self, monitor: zmq.Socket[Any]) -> None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return
            now = time.monotonic()
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.connected = True
                self.feed.connected(now)
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
                self.feed.disconnected(now)

    def _ask(self, start: int) -> None:
        """Send a replay request from `start` (on a fresh DEALER if the last one did not finish)."""
        import zmq
        import zmq.asyncio

        if self.replay_endpoint is None:
            self.feed.replay_end(time.monotonic())  # (no replay to wait for)
            return
        replay = self._replay
        if replay is None or not self._replay_done:
            poller = self._poller
            if replay is not None:
                if poller is not None:
                    poller.unregister(replay)
                replay.close(linger=0)
            replay = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            replay.connect(self.replay_endpoint)
            if poller is not None:
                poller.register(replay, zmq.POLLIN)
            self._replay = replay
        self._replay_done = False
        zmq.Socket.shadow(replay.underlying).send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
