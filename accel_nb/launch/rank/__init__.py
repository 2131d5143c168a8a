"""Code that runs inside a rank process: the one worker entry, fd-level output capture, the tqdm bridge.

``worker`` (fork / spawn / fresh-interpreter entries, the rank's runtime), ``capture`` (this rank's
stdout/stderr as ``Log`` events), ``tqdm_bridge`` (library tqdm bars -> this rank's progress events).
Nothing here runs in the launching process except the module-level constants the parent reads.
"""
