"""Admission by Kueue: everything the operator does with Kueue, in one package.

    workloads.py   pure: the Workload a job asks with, views of Workloads and ResourceFlavors, status patches
    view.py        pure: what was observed of Kueue for one job (its Workloads, the flavors, the priority)
    actions.py     pure: Kueue's own writes (PatchWorkload, ApplyWorkloadStatus), as the decisions plan them
    admission.py   pure decisions: hold a labelled job, create its Workload, run it once admitted, stop it on
                   eviction, finish; Kueue, the view the planner calls (planner.base.Integration)
    slices.py      pure decisions: grow through a workload slice, shrink in place (called by admission.py)
    io.py          for the controller: KueueIO (integrations.IntegrationIO): the watches and their caches, what a
                   reconcile reads, the writes that are Kueue's own, discovery at start
    discovery.py   for the controller: whether Kueue's API is served, at start and every minute

The planner calls Kueue through Observed.integrations, the controller calls KueueIO through the registry
(elasticjob/integrations.py), the one module outside this package that names it.
"""
