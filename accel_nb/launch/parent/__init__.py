"""Code that runs in the launching process: start the ranks, supervise them, and show what they say.

``start`` (fork, the spawn server, fresh interpreters: one ``RankProcess`` interface), ``supervisor``
(watch, stop, stacks on hang or interrupt), ``hang_blame`` (who waits in a collective), ``run`` (one
launch end to end), ``reporting`` (text / list reporters), ``launch_progress`` (per-rank state the
reporters read), ``output_lines`` (merging and bounding the ranks' output lines), ``metric_history``
(metric series for live curves).
"""
