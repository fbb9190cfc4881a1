"""The engine's thread: the one owner of the Scheduler (model/scheduler.py, which is not
thread-safe), fed by the server's request handlers through a queue.

A handler submits its requests with a sink (a callable the thread calls with what concerns them)
and may abort them. Between steps the thread takes what the queue holds — new requests join the
running batch at the next step, aborted ones leave it — then runs one step and hands each
request's updates to its sink. The sink of an asyncio handler moves them into its event loop
(`loop.call_soon_threadsafe`), so the thread never waits on a client.

What a sink receives: ACCEPTED once its requests are in the scheduler, then one list of Updates
per step that concerns them; or an exception, after which nothing more — the scheduler's refusal
of a request (a UsageError: the KV budget cannot hold it), an error of a step (every request in
flight gets it, the scheduler starts afresh, the server lives), or Closed when the server stops.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

from llmctl.model.scheduler import Request, Scheduler, Update

ACCEPTED = "accepted"


class Closed(Exception):
    """The server is stopping: what was in flight ends here."""


Sink = Callable[[object], None]


class EngineWorker:
    def __init__(self, engine, log: Callable[[str], None] = lambda message: None):
        self.engine, self.log = engine, log
        self.scheduler = Scheduler(engine, engine.config)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sinks: dict[str, Sink] = {}  # request id -> its sink
        self.left: dict[str, int] = {}  # request id -> its samples not done yet
        # scheduler requests by outcome (GET /health shows them): refused (the scheduler's
        # UsageError), failed (a step's error, or the server stopping)
        self.counts = {"accepted": 0, "finished": 0, "aborted": 0, "refused": 0, "failed": 0}
        self.thread = threading.Thread(target=self._run, name="llmctl-engine", daemon=True)
        self.closed = False

    # -- the handlers' side (any thread) -----------------------------------------------------

    def running(self) -> int:
        """Scheduler requests in flight (read from another thread: a snapshot)."""
        return len(self.left)

    def start(self) -> None:
        self.thread.start()

    def submit(self, requests: list[Request], sink: Sink) -> None:
        if self.closed:  # the thread is gone or going: nobody would answer
            sink(Closed("the server is stopping"))
            return
        self.inbox.put(("add", requests, sink))

    def abort(self, request_ids: list[str]) -> None:
        self.inbox.put(("abort", request_ids, None))

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current step; what is in flight gets Closed."""
        self.closed = True
        if self.thread.is_alive():
            self.inbox.put(None)
            self.thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            messages = [self.inbox.get()] if not self.scheduler.has_work() else []
            while True:
                try:
                    messages.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for m in messages:
                if m is None:
                    self._fail_all(Closed("the server is stopping"))
                    return
                kind, arg, sink = m
                if kind == "add":
                    self._add(arg, sink)
                else:
                    self._abort(arg)
            if self.scheduler.has_work():
                self._step()

    def _add(self, requests: list[Request], sink: Sink) -> None:
        added = []
        for r in requests:
            try:
                self.scheduler.add(r)
            except Exception as e:  # the scheduler refuses it: the handler answers, the others go on
                self._abort([a.id for a in added], count=False)
                self.counts["accepted"] -= len(added)
                self.counts["refused"] += len(requests)
                self._send(sink, e)
                return
            added.append(r)
            self.sinks[r.id], self.left[r.id] = sink, len(r.seeds)
            self.counts["accepted"] += 1
        self._send(sink, ACCEPTED)

    def _abort(self, request_ids: list[str], count: bool = True) -> None:
        for rid in request_ids:
            if self.sinks.pop(rid, None) is not None:
                del self.left[rid]
                self.scheduler.abort(rid)
                if count:
                    self.counts["aborted"] += 1

    def _step(self) -> None:
        try:
            updates = self.scheduler.step()
        except Exception as e:  # not one request's: every request in flight fails with it, the server goes on
            self.log(f"engine step failed, {len(self.sinks)} requests answered with an error: {type(e).__name__}: {e}")
            self._fail_all(e)
            self.scheduler = Scheduler(self.engine, self.engine.config)
            return
        by_sink: dict[int, tuple[Sink, list[Update]]] = {}
        for u in updates:
            sink = self.sinks.get(u.request_id)
            if sink is not None:
                by_sink.setdefault(id(sink), (sink, []))[1].append(u)
        for sink, batch in by_sink.values():
            self._send(sink, batch)
        for u in updates:  # a request stays registered until its last sample is done
            if u.done is not None and u.request_id in self.left:
                self.left[u.request_id] -= 1
                if not self.left[u.request_id]:
                    del self.left[u.request_id], self.sinks[u.request_id]
                    self.counts["finished"] += 1

    def _fail_all(self, error: Exception) -> None:
        sinks = {id(s): s for s in self.sinks.values()}
        self.counts["failed"] += len(self.sinks)
        self.sinks.clear()
        self.left.clear()
        for sink in sinks.values():
            self._send(sink, error)

    def _send(self, sink: Sink, item) -> None:
        try:
            sink(item)
        except Exception as e:  # a handler whose event loop is gone: nobody waits for it
            self.log(f"a request's answer was dropped: {type(e).__name__}: {e}")
