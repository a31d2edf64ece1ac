"""Running functions in threads (``horovod.runner.util.threads``)."""

import queue
import threading
import traceback
from typing import Any, Callable, Dict, Optional, Sequence


def _quiet(target: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> None:
        try:
            target(*args)
        except BaseException:  # noqa: BLE001 - silent=True: the caller asked not to hear it
            pass
    return run


def in_thread(target: Callable[..., Any], args: Sequence[Any] = (), name: Optional[str] = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Starts ``target(*args)`` in a new thread and returns the thread. ``silent`` swallows
    any exception the target raises instead of letting the thread print it."""
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"args must be a tuple or list, not {type(args).__name__}")
    thread = threading.Thread(target=_quiet(target) if silent else target, args=tuple(args),
                              name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable[..., Any], args: Sequence[Any] = (),
             stop: Optional[threading.Event] = None, check_stop_interval_s: float = 1.0,
             silent: bool = False) -> threading.Thread:
    """Starts a daemon thread that calls ``func(*args)`` once ``event`` is set, unless ``stop``
    is set first (checked every ``check_stop_interval_s`` seconds). Returns the thread."""
    if event is None:
        raise ValueError("event must not be None")
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"args must be a tuple or list, not {type(args).__name__}")

    def wait_then_call() -> None:
        if stop is None:
            event.wait()
        else:
            while not event.wait(check_stop_interval_s):
                if stop.is_set():
                    return
            if stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_call, silent=silent)


def execute_function_multithreaded(fn: Callable[..., Any], args_list: Sequence[Sequence[Any]],
                                   block_until_all_done: bool = True,
                                   max_concurrent_executions: int = 1000
                                   ) -> Optional[Dict[int, Any]]:
    """Calls ``fn(*args)`` for every ``args`` in ``args_list`` on up to
    ``max_concurrent_executions`` threads. Blocking: returns ``{index: result}``, and if any call
    raised, re-raises the first failure (by index) after all calls ended. Not blocking: starts
    the work and returns None."""
    if max_concurrent_executions < 1:
        raise ValueError("max_concurrent_executions must be at least 1")
    work: "queue.Queue[int]" = queue.Queue()
    for index in range(len(args_list)):
        work.put(index)
    results: Dict[int, Any] = {}
    errors: Dict[int, BaseException] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                index = work.get_nowait()
            except queue.Empty:
                return
            try:
                value = fn(*args_list[index])
                with lock:
                    results[index] = value
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                if not block_until_all_done:
                    traceback.print_exc()
                with lock:
                    errors[index] = e

    threads = [in_thread(worker) for _ in range(min(max_concurrent_executions,
                                                    len(args_list)))]
    if not block_until_all_done:
        return None
    for thread in threads:
        thread.join()
    if errors:
        raise errors[min(errors)]
    return results
