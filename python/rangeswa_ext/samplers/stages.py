"""The stage of a network call (SPEC section 4), shared by every sampler.

Samplers report each call's progress on the noise-to-data path, 0 = pure noise and 1 = clean data, in
their backbone's own time (ELF: t; LangFlow: the step's place on its grid; CoLa and LLaDA: see their
samplers). The attention method's config turns that progress into ``early`` / ``late``, and the
final readout call is ``decode``; so early and late never swap when a backbone's clock runs backwards.
"""

from __future__ import annotations

from ..config import RangeSWAConfig


def stage_rule(attention) -> RangeSWAConfig:
    """The config whose ``stage_at`` names the stage of each call: the method's own ``.config``, or
    for methods without one (their attention ignores the stage) the default switch point."""
    config = getattr(attention, "config", None)
    return config if config is not None else RangeSWAConfig()
