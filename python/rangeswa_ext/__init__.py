"""rangeswa: training-free length extrapolation for diffusion language models.

`rangeswa_ext.ops` holds the compiled ops (`torch.ops.rangeswa.*`), `rangeswa_ext.reference` the
pure-PyTorch oracle of SPEC.md, `rangeswa_ext.config` the configuration object and its presets.
"""

from .config import PRESETS, RangeSWAConfig, preset

__all__ = ["PRESETS", "RangeSWAConfig", "preset"]
__version__ = "0.1.0"
