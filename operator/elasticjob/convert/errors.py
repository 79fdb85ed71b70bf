"""What a conversion refuses."""

from __future__ import annotations


class ConversionError(ValueError):
    """A PyTorchJob that cannot be converted: the message says what and what to change."""


class InputError(ConversionError):
    """Input that is no PyTorchJob as its API defines it: not YAML, too large, YAML anchors or aliases, or a field
    of the wrong type. A class of its own so that the command line can tell it from a refused conversion: exit 2
    on it, as on a bad argument, and 1 on a job it understood but cannot convert."""
