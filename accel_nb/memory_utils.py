"""Shim at the reference's ``accelerate.memory_utils`` path, which the reference keeps only as an old path.

The reference's module holds no names (it warns that they moved); import them from ``accel_nb.utils``
or ``accel_nb.utils.memory``, as under the reference:

    from accel_nb.utils import find_executable_batch_size, release_memory
"""
