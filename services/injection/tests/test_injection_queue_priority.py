"""The model queue's priority classes: interactive waiters before background ones, a wait
bound per class, a retry hint from measured leases. Pure asyncio, no model."""

from __future__ import annotations

import asyncio

import pytest

from hippo_core.errors import ResourceExhausted
from hippo_injection import metrics
from hippo_injection.domain import queue as model_queue
from hippo_injection.domain.queue import ModelQueue, Priority, parse_priority

BACKGROUND, INTERACTIVE = Priority.BACKGROUND, Priority.INTERACTIVE


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Holder:
    """Tasks that take a lease of a given class and record when they got it."""

    def __init__(self, queue: ModelQueue) -> None:
        self.queue = queue
        self.order: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def start(self, name: str, cls: Priority | None) -> asyncio.Task[None]:
        self.release[name] = asyncio.Event()

        async def hold() -> None:
            async with self.queue.lease(cls):
                self.order.append(name)
                await self.release[name].wait()

        return asyncio.create_task(hold(), name=name)


async def test_an_interactive_request_goes_before_background_ones_queued_earlier() -> None:
    """Invariant: when the model frees, the oldest interactive waiter gets it, however
    many background waiters arrived first; background ones then run in arrival order."""
    queue = ModelQueue(max_waiting=4, max_waiting_background=4)
    h = Holder(queue)
    tasks = [h.start("running", BACKGROUND)]
    await _settle()
    for name in ("bg1", "bg2", "bg3"):
        tasks.append(h.start(name, BACKGROUND))
        await _settle()
    tasks.append(h.start("chat", INTERACTIVE))
    await _settle()
    assert queue.waiting_in(BACKGROUND) == 3 and queue.waiting_in(INTERACTIVE) == 1
    for name in ("running", "chat", "bg1", "bg2", "bg3"):
        h.release[name].set()
        await _settle()
    await asyncio.gather(*tasks)
    assert h.order == ["running", "chat", "bg1", "bg2", "bg3"]
    assert queue.waiting == 0
    await queue.close()


async def test_the_class_comes_from_the_context_and_defaults_to_interactive() -> None:
    queue = ModelQueue(max_waiting=4, max_waiting_background=4)
    h = Holder(queue)

    async def in_background(name: str) -> None:
        model_queue.priority.set(BACKGROUND)  # as the edge does for a marked request
        await h.start(name, None)

    running = h.start("running", None)
    await _settle()
    merge = asyncio.create_task(in_background("merge"))
    await _settle()
    chat = h.start("chat", None)
    await _settle()
    assert queue.waiting_in(BACKGROUND) == 1 and queue.waiting_in(INTERACTIVE) == 1
    for name in ("running", "chat", "merge"):
        h.release[name].set()
        await _settle()
    await asyncio.gather(running, merge, chat)
    assert h.order == ["running", "chat", "merge"]
    await queue.close()


async def test_each_class_has_its_own_bound() -> None:
    """A full background list never refuses an interactive request, and the reverse."""
    queue = ModelQueue(max_waiting=1, max_waiting_background=2)
    h = Holder(queue)
    tasks = [h.start("running", INTERACTIVE)]
    await _settle()
    tasks += [h.start("bg1", BACKGROUND), h.start("bg2", BACKGROUND)]
    await _settle()
    before = metrics.REJECTED.labels("background")._value.get()
    with pytest.raises(ResourceExhausted, match=r"max_waiting_background=2") as full:
        async with queue.lease(BACKGROUND):
            pass
    assert full.value.reason == "QUEUE_FULL" and full.value.retry_after is not None
    assert metrics.REJECTED.labels("background")._value.get() == before + 1
    tasks.append(h.start("chat", INTERACTIVE))  # admitted: its own list has room
    await _settle()
    assert queue.waiting_in(INTERACTIVE) == 1
    with pytest.raises(ResourceExhausted, match=r"1 interactive requests waiting"):
        async with queue.lease(INTERACTIVE):
            pass
    assert metrics.QUEUE_DEPTH.labels("background")._value.get() == 2
    assert metrics.QUEUE_DEPTH.labels("interactive")._value.get() == 1
    for name in ("running", "chat", "bg1", "bg2"):
        h.release[name].set()
        await _settle()
    await asyncio.gather(*tasks)
    assert h.order == ["running", "chat", "bg1", "bg2"]
    assert metrics.QUEUE_DEPTH.labels("background")._value.get() == 0
    await queue.close()


async def test_a_cancelled_waiter_neither_blocks_nor_takes_the_model() -> None:
    queue = ModelQueue(max_waiting=2, max_waiting_background=2)
    h = Holder(queue)
    running = h.start("running", BACKGROUND)
    await _settle()
    gone = h.start("gone", INTERACTIVE)
    merge = h.start("merge", BACKGROUND)
    await _settle()
    h.release["running"].set()  # the running lease ends before "gone" resumes...
    gone.cancel()  # ...so its release finds a cancelled waiter still listed
    await asyncio.gather(gone, return_exceptions=True)
    await _settle()
    h.release["merge"].set()
    await asyncio.gather(running, merge)
    assert h.order == ["running", "merge"] and queue.waiting == 0
    # The model is free again: a new lease is granted at once.
    async with asyncio.timeout(1), queue.lease(INTERACTIVE):
        pass
    await queue.close()


async def test_a_waiter_cancelled_just_as_it_is_handed_the_model_passes_it_on() -> None:
    queue = ModelQueue(max_waiting=2, max_waiting_background=2)
    h = Holder(queue)
    running = h.start("running", INTERACTIVE)
    await _settle()
    unlucky = h.start("unlucky", INTERACTIVE)
    merge = h.start("merge", BACKGROUND)
    await _settle()
    h.release["running"].set()
    while queue.waiting_in(INTERACTIVE):  # until the running lease has handed over...
        await asyncio.sleep(0)
    assert "unlucky" not in h.order  # ...and before "unlucky" has resumed
    unlucky.cancel()
    await asyncio.gather(running, unlucky, return_exceptions=True)
    await _settle()
    h.release["merge"].set()
    async with asyncio.timeout(1):
        await merge
    assert h.order == ["running", "merge"] and queue.waiting == 0
    await queue.close()


async def test_retry_after_grows_with_the_position_and_is_bounded() -> None:
    queue = ModelQueue(max_waiting=0, max_waiting_background=0)
    assert queue.retry_after(INTERACTIVE) == model_queue.DEFAULT_LEASE_S  # nothing measured
    async with queue.lease():
        await asyncio.sleep(0.3)
    mean = 0.3
    assert queue.retry_after(INTERACTIVE) == pytest.approx(mean, rel=0.3)
    h = Holder(ModelQueue(max_waiting=3, max_waiting_background=3))
    h.queue._lease_seconds = 2.0
    tasks = [h.start("running", INTERACTIVE)]
    await _settle()
    tasks += [h.start("bg", BACKGROUND), h.start("chat", INTERACTIVE)]
    await _settle()
    assert h.queue.retry_after(INTERACTIVE) == 4.0  # the running one + one interactive
    assert h.queue.retry_after(BACKGROUND) == 6.0  # ...and the background one ahead
    h.queue._lease_seconds = 1000.0
    assert h.queue.retry_after(BACKGROUND) == model_queue.MAX_RETRY_AFTER_S
    for name in ("running", "chat", "bg"):
        h.release[name].set()
        await _settle()
    await asyncio.gather(*tasks)
    await h.queue.close()
    await queue.close()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("background", BACKGROUND),
        (" Background ", BACKGROUND),
        ("interactive", INTERACTIVE),
        ("urgent", INTERACTIVE),
        ("", INTERACTIVE),
        (None, INTERACTIVE),
    ],
)
def test_only_background_lowers_the_class(value: str | None, expected: Priority) -> None:
    assert parse_priority(value) is expected


def test_metric_labels_are_the_classes() -> None:
    labels = {s.labels["priority"] for f in metrics.QUEUE_DEPTH.collect() for s in f.samples}
    assert labels == {p.value for p in Priority}
