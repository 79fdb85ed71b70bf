"""Builds the project's images from images/*.Dockerfile without Docker or a registry, for the local cluster's
real nodes: buildah (overlay storage, chroot isolation) on a Debian root filesystem bootstrapped by mmdebstrap, with
torch from a local wheel. The results are docker-archive tarballs for `ctr -n k8s.io images import`.

`python -m localcluster.imagebuild` (or `make images` without Docker); plan.py is the pure half, build.py runs it.
"""
