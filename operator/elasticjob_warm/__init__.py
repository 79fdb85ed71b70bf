"""Warm worker starts: torchrun's worker processes forked from one that has already imported torch.

Every time torchrun (re)starts its workers, each new process imports torch (about 2 s here) and DDP's
constructor imports `torch._dynamo` (about 2 s more) before the first step. After a lost pod, a scale change
or a failure that is most of the recovery. With

    command: [python, -m, elasticjob_warm.torchrun, train.py, ...]      (torchrun.py: torchrun itself)

the agent starts a small server (server.py) as the container starts; it imports torch once and forks a worker
for each request, and the agent joins the rendezvous once it has, so that a newcomer never holds up a running
group while its server imports. `torchrun -m elasticjob_warm train.py` forks its workers alike, its server
started by the pod's first worker. Each worker torchrun starts is then a thin client (client.py) that hands the
server its argv, environment, working directory and stdio, forwards torchrun's signals, and exits as the
worker did. When the server cannot be had the client runs the script itself, as plain torchrun would.

The wrapper also shortens the agent's rendezvous polls (polling.py): torch reads the round's state once a
second, which cost a scale-up 1.4 s of waiting for news the store already had.

Runs in the worker pod with the worker image's torch; it never imports the operator.
"""
