"""Planning a device map: where every module goes, before anything is loaded or moved.

- ``device_map``: ``plan_device_map``, ``infer_auto_device_map`` and ``resolve_device_map`` (the entry
  points; every name below is importable from there too)
- ``greedy_planner``: the placement in module order (splits, tied weights, ``fallback_allocation``)
- ``map_checks``: checks of a given map (``check_device_map``, ``check_devices_exist``, ``device_for``)
- ``sizes``: module sizes, memory budgets, tied parameters
- ``headroom``: the GPU room the offload engine needs; ``reference_planning``: the reference's reserve
  and merge rules; ``map_errors``: ``DeviceMapError``

Nothing is imported here: ``accel_nb.big_model`` exports the public names.
"""
