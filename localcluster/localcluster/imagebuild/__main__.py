"""`python -m localcluster.imagebuild [--only NAME]`: prints the tarballs' paths on stdout, progress on stderr,
and exits 2 with one line when a prerequisite is missing (1 when a step fails, 130 when interrupted)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from localcluster.imagebuild import build, plan

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
    return parser.parse_args(argv)


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
    specs = tuple(s for s in plan.IMAGES if not args.only or s.name in args.only)
    started = time.monotonic()
    try:
        tarballs = build.build_all(build.Inputs(ROOT, args.cache_dir, wheels[-1], log), specs)
    except build.BuildError as error:
        print(f"imagebuild: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C, or `localcluster up` stopping it; the scratch storage is gone already
        print("imagebuild: interrupted", file=sys.stderr)
        return 130
    log(f"done in {time.monotonic() - started:.1f}s")
    for tarball in tarballs:
        print(tarball)
    return 0


if __name__ == "__main__":
    sys.exit(main())
