"""Gang scheduling of a job's workers: everything the operator does with PodGroups, in one package.

    podgroup.py    pure: the PodGroup of either API (the Workload API's, scheduler-plugins' Coscheduling) and
                   how a worker joins it
    planning.py    pure decisions: the group kept at minReplicas, made before the workers; Gang, the view the
                   planner calls (planner.base.Integration: the placements, ensure_gang before the workers)
    io.py          for the controller: GangIO (integrations.IntegrationIO): the group read without a watch and
                   remembered (observe, after_apply)

The planner calls Gang through Observed.integrations, the controller GangIO through the registry
(elasticjob/integrations.py), the one module outside this package that names it. Creating, patching and
deleting the group are the controller's generic object actions (controller/apply.py).
"""
