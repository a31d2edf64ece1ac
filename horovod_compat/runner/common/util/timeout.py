"""A deadline that launcher loops check while waiting for something."""

import time


class TimeoutException(TimeoutError):
    """A ``Timeout`` passed; ``message`` says what was being waited for."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Timeout:
    """A deadline ``timeout`` seconds from now. ``message`` is the error text when it passes; it
    may contain ``{activity}``, filled in by ``check_time_out_for``."""

    def __init__(self, timeout: float, message: str) -> None:
        self._timeout = timeout
        self._deadline = time.time() + timeout
        self._message = message

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self._deadline - time.time())

    def timed_out(self) -> bool:
        """Whether the deadline has passed."""
        return time.time() > self._deadline

    def check_time_out_for(self, activity: str) -> None:
        """Raises ``TimeoutException`` naming ``activity`` when the deadline has passed."""
        if self.timed_out():
            text = self._message.format(activity=activity).rstrip()
            if not text.endswith("."):
                text += "."
            raise TimeoutException(f"{text} Timeout after {self._timeout} seconds.")
