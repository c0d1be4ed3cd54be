"""The member extensions chute knows, and what each kind is: one table for the
decoders, the webdataset compiler, ``chute inspect`` and the tar index.

A member's kind is decided by the last extension of its name
(``"seg.npy"`` is an npy member), as webdataset's decoder decides it.
"""

from __future__ import annotations

import re

from chute import _core

# Extensions webdataset hands to its image decoder (Pillow's formats).
IMAGE_EXTENSIONS = frozenset(
    (
        "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf "
        "png apng jp2 j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg "
        "msp pcd pxr pbm pgm ppm pnm psd bw rgb rgba sgi ras tga icb vda vst webp wmf "
        "emf xbm xpm"
    ).split()
)
# The image formats the engine decodes natively (others go through Pillow):
# the extensions of its codec table (csrc/decode/image_decoder.cc).
NATIVE_IMAGE_EXTENSIONS = frozenset(
    extension for image_format in _core.image_formats() for extension in image_format.extensions
)
# Integer class labels, written as decimal text.
INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "inx", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
PICKLE_EXTENSIONS = frozenset({"pkl", "pickle", "pyd"})
NPY_EXTENSION = "npy"

# The names webdataset gives a sample's key and shard url in the sample dict;
# no member may carry them as extension.
KEY_FIELD = "__key__"
URL_FIELD = "__url__"
SAMPLE_FIELDS = (KEY_FIELD, URL_FIELD)


def last_extension(name: str) -> str:
    """The part of `name` after its last dot (all of it without a dot), by
    webdataset's regular expression."""
    return re.sub(r".*[.]", "", name)
