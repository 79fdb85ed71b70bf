"""`python -m localcluster.imagebuild [--only NAME] [--push-local | --push REGISTRY] [--version X.Y.Z]`: prints
the tarballs' paths on stdout (with --push, `<reference>@<digest>` of each pushed image), progress on stderr, and
exits 2 with one line when a prerequisite is missing (1 when a step fails, 130 when interrupted).

--push-local pushes to the local cluster's registry (registry.py; it must run: `make cluster-up REAL_NODES=1`),
with its credentials and CA. --push REGISTRY (host/path) pushes with buildah's own login (`buildah login`) and the
system's CAs. --version tags the images with another version than the chart's appVersion (`make release`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

from localcluster.imagebuild import build, plan, push

ROOT = Path(__file__).resolve().parents[3]


def log(line: str) -> None:
    print(f"[imagebuild] {line}", file=sys.stderr, flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m localcluster.imagebuild", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "elasticjob" / "images")
    parser.add_argument("--torch-wheels", type=Path,
                        default=Path(os.environ.get("ELASTICJOB_TORCH_WHEELS", ROOT.parent / "shared" / "wheels")),
                        help="directory holding the CPU torch wheel the worker image installs")
    parser.add_argument("--only", choices=[spec.name for spec in plan.IMAGES], action="append")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--push-local", action="store_true", help="push to the local cluster's registry")
    where.add_argument("--push", metavar="REGISTRY", help="push to host[:port]/path with buildah's login")
    parser.add_argument("--version", help="tag with this version instead of the chart's appVersion")
    return parser.parse_args(argv)


def retagged(spec: plan.ImageSpec, version: str | None) -> plan.ImageSpec:
    """The spec under another version: its tag's version part replaced (0.1.0-cpu -> 0.2.0-cpu)."""
    if not version:
        return spec
    return dataclasses.replace(spec, tag=version + spec.tag.removeprefix(plan.VERSION))


def push_target(args: argparse.Namespace) -> push.Target | None:
    if args.push:
        return push.Target(args.push)
    if not args.push_local:
        return None
    from localcluster import registry
    from localcluster.layout import Layout

    layout = Layout(ROOT)
    if not registry.running(layout):
        raise SystemExit("imagebuild: no local registry answers at "
                         f"{registry.ADDRESS}: `make cluster-up REAL_NODES=1` starts it")
    return push.local_target(layout)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # buildah takes only absolute host paths for its bind mounts (make passes ../shared/wheels).
    args.torch_wheels, args.cache_dir = args.torch_wheels.resolve(), args.cache_dir.resolve()
    worker = (ROOT / "images" / "worker-cpu.Dockerfile").read_text()
    version = plan.arg_default(worker, "TORCH_VERSION") or "?"
    wheels = sorted(args.torch_wheels.glob(plan.torch_wheel_pattern(version)))
    problem = plan.preflight(os.geteuid(), shutil.which, args.torch_wheels, wheels, version,
                             sys.version_info[:2])
    if problem:
        print(f"imagebuild: {problem}", file=sys.stderr)
        return 2
    specs = tuple(retagged(s, args.version) for s in plan.IMAGES if not args.only or s.name in args.only)
    target = push_target(args)
    started = time.monotonic()
    try:
        tarballs = build.build_all(build.Inputs(ROOT, args.cache_dir, wheels[-1], log), specs)
        if target is not None:
            digests = push.push_all(list(zip(specs, tarballs, strict=True)), target, args.cache_dir, log)
    except (build.BuildError, RuntimeError) as error:
        print(f"imagebuild: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C, or `localcluster up` stopping it; the scratch storage is gone already
        print("imagebuild: interrupted", file=sys.stderr)
        return 130
    log(f"done in {time.monotonic() - started:.1f}s")
    for line in ([f"{ref}@{digest}" for ref, digest in digests.items()] if target else tarballs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
