"""Prepared weights as module buffers that keep their dtype through ``module.to(dtype)``."""

from __future__ import annotations

import torch

__all__ = ["PreparedBuffers"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class PreparedBuffers(torch.nn.Module):
    """A module whose buffers named in ``_prepared`` hold a prepared weight format: a device
    move (``.to("cuda")``, ``.cuda()``, ``to_empty``) moves them, a floating-point cast
    (``.half()``, ``.to(torch.float32)``, ``model.to(dtype)``) leaves them as they are, since
    casting bf16 group scales or FP8 codes would change the format, not the precision."""

    _prepared: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        order = list(self._buffers)
        held = {n: self._buffers.pop(n) for n in self._prepared if n in self._buffers}
        try:
            super()._apply(fn, recurse)
        except BaseException:
            self._restore(order, held)
            raise
        for name, t in held.items():
            if t is not None and (t.is_floating_point() or t.is_complex()):
                # through an integer view: `_apply`'s casts touch floating-point tensors only
                held[name] = fn(t.view(_BITS[t.element_size()])).view(t.dtype)
            elif t is not None:
                held[name] = fn(t)
        self._restore(order, held)
        self._prepared_changed()
        return self

    def _restore(self, order: list[str], held: dict) -> None:
        current = {**self._buffers, **held}
        self._buffers.clear()
        self._buffers.update((n, current[n]) for n in order)

    def _prepared_changed(self) -> None:
        """Called after the prepared buffers were moved (drop cached views of them)."""
