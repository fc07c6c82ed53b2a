"""A progress bar for long loads: tqdm when it is installed, else one stderr line rewritten
in place. It stays silent unless asked for or stderr is a terminal, and it appears only once
a load has run for `DELAY_S` (short loads print nothing)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "DELAY_S"]

DELAY_S = 1.0
_REFRESH_S = 0.25


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


class Progress:
    """Bytes read out of `total`. enabled: True / False, or None for "when stderr is a
    terminal"; stream: where the fallback line goes (stderr); use_tqdm: False forces the
    fallback line."""

    def __init__(self, total: int, desc: str, enabled: bool | None = None, *,
                 stream: TextIO | None = None, use_tqdm: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled, self.total, self.desc, self.done = enabled, total, desc, 0
        self._bar = None
        self._start = time.monotonic()
        self._last = 0.0
        self._printed = False
        if enabled and use_tqdm:
            try:
                from tqdm import tqdm  # noqa: PLC0415  (optional dependency)
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                                 delay=DELAY_S, leave=False, file=self.stream)

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._start < DELAY_S or (now - self._last < _REFRESH_S and self.done < self.total):
            return
        self._last = now
        pct = 100.0 * self.done / self.total if self.total else 100.0
        self.stream.write(f"\r{self.desc}: {_mib(self.done)}/{_mib(self.total)} MiB ({pct:.0f}%)")
        self.stream.flush()
        self._printed = True

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._printed:
            self.stream.write("\n")
            self.stream.flush()
            self._printed = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
