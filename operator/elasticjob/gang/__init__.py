"""Gang scheduling of a job's workers: everything the operator does with PodGroups, in one package.

    podgroup.py    pure: the PodGroup of either API (the Workload API's, scheduler-plugins' Coscheduling) and
                   how a worker joins it
    planning.py    pure decisions: the group kept at minReplicas, made before the workers (the planner calls
                   ensure_gang)
    io.py          for the controller: the group read without a watch and remembered (observe, after_apply)

The planner (planner/lifecycle.py) calls planning.ensure_gang and podgroup's placements; the controller calls
io.observe (controller/observing.py) and io.after_apply (controller/reconcile.py). Creating, patching and
deleting the group are the controller's generic object actions (controller/apply.py).
"""
