"""Kueue's part of the operator's settings: its flags, what they set, and where it keeps them (Settings carries
each integration's settings under its name; the core reads none of them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from elasticjob.domain import Settings

NAME = "kueue"


@dataclass(frozen=True)
class KueueSettings:
    # Jobs labelled kueue.x-k8s.io/queue-name wait for Kueue's admission: Kueue's API is served (auto) or
    # --kueue on. Without it such jobs hold and say why; `mode` (auto, on, off) says which words they use.
    on: bool = False
    mode: str = "auto"
    # A job under Kueue grows past what Kueue admitted through a workload slice (Kueue's feature gate
    # ElasticJobsViaWorkloadSlices, on by default since v0.18); off: replicas above the admitted count wait.
    slices: bool = True
    # Every job must name a LocalQueue (label kueue.x-k8s.io/queue-name): one without it holds and says why
    # (--require-queue-name; the chart's kueue.requireQueueName or kueue.defaultQueueName).
    require_queue_name: bool = False


def of(settings: Settings) -> KueueSettings:
    found = settings.integration(NAME)
    return found if isinstance(found, KueueSettings) else KueueSettings()


def with_kueue(settings: Settings, kueue: KueueSettings) -> Settings:
    return settings.with_integration(NAME, kueue)


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--kueue", nargs="?", const="on", default="auto", choices=["auto", "on", "off"],
                     help="jobs labelled kueue.x-k8s.io/queue-name wait for Kueue's admission (watching Kueue's "
                     "Workloads and ResourceFlavors). auto (default): when Kueue's API is served, checked every "
                     "minute; on (or bare --kueue): always, Kueue's CRDs must be installed; off: never. Without "
                     "Kueue such jobs do not start and say why")
    run.add_argument("--kueue-slices", default="on", choices=["on", "off"],
                     help="a job under Kueue that scales up past what Kueue admitted asks for a workload slice, "
                     "charged only the difference, and shrinks its Workload in place (needs Kueue's feature gate "
                     "ElasticJobsViaWorkloadSlices, on by default since Kueue v0.18). off: replicas above the "
                     "admitted count wait until the job is queued again")
    run.add_argument("--require-queue-name", action="store_true",
                     help="every job must be labelled kueue.x-k8s.io/queue-name: one without the label does not "
                     "start and says why (as Kueue's manageJobsWithoutQueueName, but held rather than queued)")


def from_arguments(args: argparse.Namespace) -> KueueSettings:
    return KueueSettings(on=args.kueue == "on", mode=args.kueue, slices=args.kueue_slices == "on",
                         require_queue_name=args.require_queue_name)
