"""A small real HTTP server speaking text-generation-inference's generate API, as a
double of the merge LLM: the summariser's real `text_generation.AsyncClient` talks to it
over TCP. It records every request, answers with a settable function of the prompt, can
hold requests (a merge kept in flight) and can go down and come back on the same port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hippo_core.listen import reserve_port


def echo(prompt: str) -> str:
    """A faithful summariser that follows the prompt's style: "rewrite" (the prompt ends
    with "Note:") gets the old summary then each new line as a sentence; "extend" (the
    note is pre-filled with the first speaker's name) gets the continuation of a
    retelling of the new lines only. Ends with the newline a TGI stop sequence leaves."""
    old, _ = last_case(prompt)
    new = said(prompt)
    if prompt.endswith("Note:"):
        return f" {'' if old == 'none yet.' else old} {new}".rstrip() + "\n"
    anchor = prompt.rsplit("Note: ", 1)[1]
    return new[len(anchor) :] + "\n"


def said(prompt: str) -> str:
    """The new lines retold, as both styles' notes end."""
    return " ".join(x.replace(": ", " said: ", 1).rstrip(".") + "." for x in last_case(prompt)[1])


def note(prompt: str) -> str:
    """The note the service composes from `echo`'s answer (the prefill + continuation)."""
    if prompt.endswith("Note:"):
        return echo(prompt).strip()
    return (prompt.rsplit("Note: ", 1)[1] + echo(prompt)).strip()


def last_case(prompt: str) -> tuple[str, list[str]]:
    """(the old summary, the new lines) of the case a merge prompt asks about."""
    case = prompt.rsplit("\n\nSummary: ", 1)[1].splitlines()
    lines = [x for x in case[1:] if not x.startswith(("New lines", "Must mention", "Note:"))]
    return case[0], lines


class TgiDouble:
    def __init__(self) -> None:
        self.port = reserve_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's HTTP headers
        self.respond: Callable[[str], str] = echo
        self.released = threading.Event()
        self.released.set()
        self.received = threading.Event()  # set by every request
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        """Down: the port refuses connections (requests in flight are dropped)."""
        if self._runner is not None:
            self._call(self._runner.cleanup())
            self._runner = None

    def prompts(self) -> list[str]:
        return [str(r["inputs"]) for r in self.requests]

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/", self._generate)
        app.router.add_post("/generate", self._generate)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()
        self._runner = runner

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.headers.append(dict(request.headers))
        self.requests.append(body)
        self.received.set()
        while not self.released.is_set():
            await asyncio.sleep(0.05)
        text = self.respond(str(body["inputs"]))
        details = {
            "finish_reason": "stop_sequence",
            "generated_tokens": len(text.split()),
            "seed": body.get("parameters", {}).get("seed"),
            "prefill": [],
            "tokens": [],
        }
        return web.json_response([{"generated_text": text, "details": details}])
