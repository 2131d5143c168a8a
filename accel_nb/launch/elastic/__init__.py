"""Several machines: torchrun's elastic rendezvous, the notebook's seat in a multi-machine job, agent failures.

``rendezvous`` (how machines meet, its checks and errors), ``multinode`` (this machine's seat when a
notebook launch has ``num_nodes > 1``: ``MultiNodeLauncher``), ``agent_failures`` (what
``accel-nb launch`` says when torchrun's agent reports failed ranks).
"""
