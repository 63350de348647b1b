"""compressed-tensors stand-in for the orchestrator simulator (stdlib only, Python 3.8+).

Only the part SGLang touches while loading a checkpoint exists: the `CompressionFormat` enum,
whose members depend on the release, as in the real package.
"""

from compressed_tensors.config import *  # noqa: F401,F403
from compressed_tensors.config import CompressionFormat  # noqa: F401
from compressed_tensors.version import __version__  # noqa: F401
