# The operator image: `docker build -f images/operator.Dockerfile -t elasticjob-operator:dev .` from the repo root.
# Two stages, so the build tools never reach the image that runs in the cluster.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# The operator's distribution: the operator and the programs of the job's pods (operator/). The local cluster is a
# distribution of its own (localcluster/pyproject.toml) and never reaches the image.
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .
# A static busybox for the kit (elasticjob_kit): its launcher runs under it in job images without a shell.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends busybox-static && rm -rf /var/lib/apt/lists/*

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# The wheel pins nothing beyond pyproject's ranges; its dependencies come from the package index.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --from=build /bin/busybox /opt/elasticjob/bin/busybox
# A fixed non-root uid (the "nonroot" convention), so runAsNonRoot can be checked without a passwd entry.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["elasticjob", "run"]
# The chart replaces these; they make a bare `docker run` watch every namespace with probes and metrics on.
CMD ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090"]
