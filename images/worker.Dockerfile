# A GPU-capable worker for real clusters: PyTorch's official CUDA runtime image plus the example trainer.
# Pick another tag with --build-arg BASE=...; torch in the worker, in the rendezvous pod and in every
# agent must be the same version (the c10d store's wire protocol is torch's own). The default is a torch
# `make compat` ran the store's nudges and warm starts on (docs/behaviour.md, "Torch versions"); outside torch
# 2.6 to 2.13 they turn themselves off.
ARG BASE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime
FROM ${BASE}
WORKDIR /workspace
# Both paths work: examples/elasticjob.yaml names the repo's layout, a plain `torchrun train_ddp.py` the short one.
COPY examples/train_ddp.py /workspace/examples/train_ddp.py
COPY examples/train_ddp.py /workspace/train_ddp.py
# The job's rendezvous pod runs this image too: `python -m elasticjob_store` (the c10d store and its control
# endpoint; it needs nothing but torch, and not the operator).
COPY operator/elasticjob_store /opt/elasticjob/elasticjob_store
# `python -m elasticjob_warm.torchrun train.py`: torchrun whose workers are forked from a process that imported
# torch once (restarts without `import torch`).
COPY operator/elasticjob_warm /opt/elasticjob/elasticjob_warm
# `import elasticjob_progress` in a training script: its steps and checkpoints shown in the job's downtime ledger.
COPY operator/elasticjob_progress /opt/elasticjob/elasticjob_progress
# `import elasticjob_ckpt`: checkpoints saved into the pod's memory and persisted behind (the example uses it).
COPY operator/elasticjob_ckpt /opt/elasticjob/elasticjob_ckpt
ENV PYTHONPATH=/opt/elasticjob
# torchrun comes with the base image; the operator supplies every PET_* setting through the environment.
CMD ["torchrun", "/workspace/train_ddp.py"]
