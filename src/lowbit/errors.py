"""lowbit's exceptions: one base class, and subclasses of the built-in exceptions Python users
already catch (``ValueError`` for a value or shape that is wrong, ``TypeError`` for a wrong kind
or dtype, ``RuntimeError`` for an environment that cannot run the call).

Every message names the argument, what was expected and what was given.
"""

from __future__ import annotations

__all__ = [
    "LowbitError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "RoutingError",
    "FormatError",
    "UnsupportedError",
    "BackendError",
    "LowbitWarning",
    "EngineFallbackWarning",
]


class LowbitError(Exception):
    """Base class of every error lowbit raises on purpose."""


class ShapeError(LowbitError, ValueError):
    """A tensor's rank or sizes do not match what the op needs."""


class DTypeError(LowbitError, TypeError):
    """An argument has the wrong type or dtype."""


class DeviceError(LowbitError, ValueError):
    """Tensors that must share a device do not, or a tensor has no storage (meta)."""


class RoutingError(LowbitError, ValueError):
    """A routing (topk ids and weights, routing buffers) does not fit the weights or the batch."""


class FormatError(LowbitError, ValueError):
    """A tensor does not match the format, or the scheme asked for is not supported."""


class UnsupportedError(LowbitError, ValueError):
    """A legal input that this version does not implement (e.g. a quantization scheme)."""


class BackendError(LowbitError, RuntimeError):
    """The environment cannot run the call (no GPU and no Triton interpreter, a missing driver)."""


class LowbitWarning(UserWarning):
    """Base class of lowbit's warnings."""


class EngineFallbackWarning(LowbitWarning):
    """A fast engine could not be built on the installed Triton; the portable engine runs instead."""
