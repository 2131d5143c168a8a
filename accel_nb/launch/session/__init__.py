"""Interactive sessions: ranks kept alive across commands, each command supervised until every rank answered.

``warm_session`` (``WarmSession``: the parent side's lifecycle and verbs), ``health`` (what a command did
to the ranks, a broken session or process group, and re-forming the group), ``cell_supervisor`` (one command's
supervision), ``cell_report`` (what the user is told when a cell fails, hangs or is interrupted, and
about a re-formed process group), ``loop`` (``SessionLoop``: the rank side, running commands in one
namespace).
"""
