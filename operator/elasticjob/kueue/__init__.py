"""Admission by Kueue: everything the operator does with Kueue, in one package.

    workloads.py   pure: the Workload a job asks with, views of Workloads and ResourceFlavors, status patches
    admission.py   pure decisions: hold a labelled job, create its Workload, run it once admitted, stop it on
                   eviction, finish (the planner calls gate() and finish())
    slices.py      pure decisions: grow through a workload slice, shrink in place (called by admission.py)
    io.py          for the controller: what a reconcile reads (observe) and the writes that are Kueue's own
    discovery.py   for the controller: whether Kueue's API is served, at start and every minute

The planner (planner/lifecycle.py) calls admission.gate and admission.finish; the controller calls io.observe
(controller/observing.py), io.apply (controller/apply.py) and discovery (controller/kopf_app.py), and watches
Workloads and ResourceFlavors (controller/watch.py) into its mirror. Nothing else knows Kueue.
"""
