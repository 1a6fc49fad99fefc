"""The rooms of ``decide``: one module per command family, and the follow-up work they leave each other.

Command handlers, by family: :mod:`.nodes` (AddNode, RemoveNode, CordonNode, UncordonNode,
DrainNode, MarkNodeFailed), :mod:`.pods` (SubmitPod, Release; placing a pod), :mod:`.gangs`
(SubmitGang, ReleaseGang; placing a gang), :mod:`.tenancy` (SetPolicy, SetQuota, RemoveQuota),
:mod:`.clock` (Tick; timers coming due), :mod:`.defragment` (Defragment).

Follow-up work (the worklist's kinds, :mod:`processor.core.decision`): :mod:`.queue` (retry the queue
when capacity or quota grew), :mod:`.rescheduling` (the evicted and the victims back to placement;
dependants whose dependencies ended), :mod:`.reservations` (keep the reservation with the head of the
queue). Leaf emitters that place nothing: :mod:`.evictions`, :mod:`.dependants`, :mod:`.reservations`.

A handler leaves follow-up work by kind (``decision.then``) and never calls into another room's
follow-ups, so no module here imports one that imports it back (``tests/unit/test_import_rules.py``).
"""
