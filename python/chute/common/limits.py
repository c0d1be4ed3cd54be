"""Process-wide limits of the native decoders."""

from __future__ import annotations

from chute import _core


def set_max_image_pixels(pixels: int | None) -> None:
    """Images of more than `pixels` pixels are refused from their header,
    before any pixel memory exists: a ``DataError`` that a skipping handler
    skips like any bad sample. The default, 178,956,970, is where Pillow
    raises ``DecompressionBombError`` (twice ``PIL.Image.MAX_IMAGE_PIXELS``);
    chute has no warning band below it. ``None`` removes the limit (as
    ``PIL.Image.MAX_IMAGE_PIXELS = None`` does for Pillow). It applies to
    every engine in the process, including ones already running."""
    if pixels is not None and (isinstance(pixels, bool) or int(pixels) <= 0):
        raise ValueError(f"max image pixels must be a positive int or None, not {pixels!r}")
    _core.set_max_image_pixels(None if pixels is None else int(pixels))


def get_max_image_pixels() -> int | None:
    """The current limit of ``set_max_image_pixels`` (None: no limit)."""
    return _core.max_image_pixels()
