# A CPU-only worker for kind and laptops: python slim + torch + the example trainer.
#
# Without TORCH_INDEX_URL pip takes torch from the default package index, whose Linux build pulls the
# CUDA libraries (about 4 GB). For a small image pass PyTorch's own wheel index, its CPU variant
# (the index URL ending in /whl/cpu), as --build-arg TORCH_INDEX_URL=...; that build is about 200 MB.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# torch is pinned through TORCH_VERSION, which hadolint cannot see through.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
    && python -c "import torch; print(torch.__version__)"
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
# Workers run as the base's user unless their template says otherwise (the example's checkpoints go to a hostPath
# the kubelet creates root-owned); the rendezvous pod sets its own non-root user (65532, runAsNonRoot).
CMD ["torchrun", "/workspace/train_ddp.py"]
