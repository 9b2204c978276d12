"""After a failed Orbax read: no tensorstore read left running, and a few words on what failed.

Orbax closes its event loop while reads are still in flight when one of them fails;
`failed_reads_cleaned_up()` installs an event-loop policy whose loops let their tasks finish
first (`_DrainingLoopPolicy`). `read_failure` and `unreadable_steps` word the warning a
fallback restore prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Mapping


class _DrainingLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """Event loops that let their unfinished tasks finish before closing (asyncio.run
    cancels and awaits them).

    Orbax runs each restore in a fresh loop (run_until_complete, then close, without that
    step) and reads the arrays with asyncio.gather. When one read fails, the gather raises at
    once and the loop closes while the other reads are still in flight: their tensorstore
    futures later call back into the closed loop ("RuntimeError: Event loop is closed" with a
    traceback, from tensorstore's threads, often at interpreter exit) and their failed tasks
    are logged when collected ("Task exception was never retrieved")."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        close = loop.close

        def drain_then_close() -> None:
            if not loop.is_closed() and not loop.is_running():
                # also runs the callbacks queued before it (gather marking the exceptions of
                # reads that failed after the first one as retrieved)
                loop.run_until_complete(_settle(asyncio.all_tasks(loop)))
            close()

        loop.close = drain_then_close
        return loop


_SETTLE_SECONDS = 60.0


async def _settle(tasks: set[asyncio.Task]) -> None:
    """Lets `tasks` finish (cancelling those still running after _SETTLE_SECONDS) and marks
    their errors as seen. Reads are not cancelled at once: a cancelled tensorstore read may
    still call back into the loop after it closed."""
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=_SETTLE_SECONDS)
        for task in late:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# absl status codes, as tensorstore starts its error messages
_STATUS_CODES = ("CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


_STATUS_CODE = re.compile(r"\b(" + "|".join(_STATUS_CODES) + r"): ")


def read_failure(item: str, error: BaseException) -> str:
    """A few words on a failed Orbax read of `item` (e.g. "OUT_OF_RANGE reading state"): the
    status code of the innermost error that has one (orbax's own messages embed whole
    tensorstore specs), else the innermost error, shortened."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) and cause not in chain:
        chain.append(cause)
    for inner in reversed(chain):
        if code := _STATUS_CODE.search(str(inner)):
            return f"{code.group(1)} reading {item}"
    inner = chain[-1]
    message = " ".join(str(inner).split())
    message = message if len(message) <= 120 else message[:117] + "..."
    return f"{type(inner).__name__} reading {item}" + (f": {message}" if message else "")


def unreadable_steps(failures: Mapping[int, str]) -> str:
    """"step 4 is unreadable (why)" or "steps 6, 4 are unreadable (step 6: why; step 4: why)"."""
    if len(failures) == 1:
        [(step, problem)] = failures.items()
        return f"step {step} is unreadable ({problem})"
    problems = set(failures.values())
    why = (problems.pop() if len(problems) == 1
           else "; ".join(f"step {step}: {problem}" for step, problem in failures.items()))
    return f"steps {', '.join(map(str, failures))} are unreadable ({why})"


_LOOP_POLICY_LOCK = threading.Lock()


@contextlib.contextmanager
def failed_reads_cleaned_up():
    """Orbax calls inside this block leave no reads running after a failure (see
    _DrainingLoopPolicy); a process with its own event loop policy (e.g. uvloop's) keeps it."""
    with _LOOP_POLICY_LOCK:
        previous = asyncio.get_event_loop_policy()
        if type(previous) is not asyncio.DefaultEventLoopPolicy:
            yield
            return
        asyncio.set_event_loop_policy(_DrainingLoopPolicy())
        try:
            yield
        finally:
            asyncio.set_event_loop_policy(previous)
