"""The recorded stages of a webdataset pipeline: one class per stage kind
(``base.Stage`` says what each knows), grouped by family, one module each:
a family's stages share their Python helpers.

- ``shuffle``: ``shuffle``
- ``decode``: ``decode``
- ``fields``: ``rename``, ``to_tuple``
- ``batching``: ``batched``, ``unbatched``, ``unlisted``
- ``functions``: ``map``, ``map_dict``, ``map_tuple``, ``select``, ``associate``,
  ``compose``
- ``patterns``: ``rename_keys``, ``extract_keys``, ``xdecode``
- ``passthrough``: ``slice``, ``rsample``, ``log_keys``, ``info``

``chute.stream.filters`` builds them under webdataset's function names and
``chute.stream.fluent`` under its method names.
"""

from chute.stream.stages.base import STAGE_CLASSES, PythonRun, Stage
from chute.stream.stages.batching import Batched, Unbatched, Unlisted
from chute.stream.stages.decode import Decode
from chute.stream.stages.fields import Rename, ToTuple
from chute.stream.stages.functions import Associate, Compose, Map, MapDict, MapTuple, Select
from chute.stream.stages.passthrough import Info, LogKeys, RSample, Slice
from chute.stream.stages.patterns import ExtractKeys, RenameKeys, XDecode
from chute.stream.stages.shuffle import Shuffle

__all__ = [
    "STAGE_CLASSES",
    "Associate",
    "Batched",
    "Compose",
    "Decode",
    "ExtractKeys",
    "Info",
    "LogKeys",
    "Map",
    "MapDict",
    "MapTuple",
    "PythonRun",
    "RSample",
    "Rename",
    "RenameKeys",
    "Select",
    "Shuffle",
    "Slice",
    "Stage",
    "ToTuple",
    "Unbatched",
    "Unlisted",
    "XDecode",
]
