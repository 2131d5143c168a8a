"""Shim at the reference's path (``accelerate.inference``): ``prepare_pippy`` lives in accel_nb.parallel.pipeline."""

from .lazy_exports import lazy_exports
from .parallel.pipeline import prepare_pippy
from .reexports import reexports

__all__ = ["prepare_pippy"]


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
