"""rangeswa: training-free length extrapolation for diffusion language models.

Importing the package loads the compiled extension, so ``torch.ops.rangeswa.*`` exist after
``import rangeswa_ext``. `rangeswa_ext.ops` holds the typed wrappers of those ops,
`rangeswa_ext.reference` the pure-PyTorch oracle of SPEC (docs/spec.md), `rangeswa_ext.config` the configuration
object and its presets.
"""

from . import ops
from .config import PRESETS, RangeSWAConfig, preset

__all__ = ["PRESETS", "RangeSWAConfig", "ops", "preset"]
__version__ = "0.1.0"
