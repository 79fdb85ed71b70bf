"""The controller: the operator's own reconcile engine, as controller-runtime is Go's. Watches list and watch
jobs and what they own (reflector.py, watch.py) into a cache (mirror.py); a work queue (loops.py) runs one
reconcile per job at a time (reconcile.py: observe, plan, apply, write status, then post the Events);
kopf_app.py, the one module that imports kopf, runs the process around it."""
