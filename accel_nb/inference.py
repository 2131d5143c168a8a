"""Shim at the reference's path (``accelerate.inference``): ``prepare_pippy`` lives in accel_nb.parallel.pipeline."""

from .parallel.pipeline import prepare_pippy

__all__ = ["prepare_pippy"]
