"""What a conversion refuses."""

from __future__ import annotations


class ConversionError(ValueError):
    """A PyTorchJob that cannot be converted: the message says what and what to change."""
