"""The integrations the operator runs, and the one module outside their packages that names them.

An integration is a package (elasticjob/kueue, elasticjob/gang) with two halves, as Kueue's jobframework has its
GenericJob interface and a reconciler that calls it:
- for the planner, pure: a view of what was observed for a job that makes the integration's decisions
  (planner.Integration: gate, ready_for_workers, finish), carried in Observed.integrations;
- for the controller, IntegrationIO below: its memory per job and what it reads for a job (that view); and,
  where it has them, what it does at start (Starts), what it watches (Watches), the actions of its own it
  applies (Acts) and what it learns from a plan's actions (Follows).
The planner and the controller walk these; neither imports an integration (pyproject.toml's contracts and
tests/unit/test_integration_seam.py keep it so). An integration with flags of its own (Configurable) adds them to
`elasticjob run` and keeps what they set in Settings under its name, which only it reads. Adding one is a
package and a line in `INTEGRATIONS`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from elasticjob import k8s, planner
from elasticjob.domain import JobRef, Settings
from elasticjob.gang.io import GangIO
from elasticjob.kindcache import Cache, Watched
from elasticjob.kueue.io import KueueIO
from elasticjob.models import StatusPart

# An integration's memory: its own type, which only it reads (the controller keeps it by the integration's name).
M = TypeVar("M")


class IntegrationIO(Protocol[M]):
    """One integration, as the controller runs it (one instance per operator process): what every integration
    has. What only some do is in the optional protocols below, which the controller finds with isinstance. The
    controller holds them as IntegrationIO[Any]: each one's memory type is checked below, where it is listed."""

    name: str  # its key in a job's memory and in Settings

    def memory(self) -> M:
        """What a job's loop remembers for it between reconciles (a fresh one per job), which `read` and
        `after_apply` are handed back."""
        ...

    async def read(self, kube: k8s.Kube, memory: M, ref: JobRef, settings: Settings) -> planner.Integration:
        """What it sees of one job, as the view the planner calls."""
        ...


@runtime_checkable
class Starts(Protocol):
    """An integration that looks at the cluster when the operator starts (optional)."""

    async def start(self, kube: k8s.Kube, settings: Settings,
                    logger: logging.Logger) -> tuple[Settings, list[Coroutine[Any, Any, None]]]:
        """Before the watches: the settings as the integration finds the cluster (is its API served?), and
        what it runs in the background meanwhile."""
        ...


@runtime_checkable
class Watches(Protocol):
    """An integration that watches kinds of its own into its own caches (optional)."""

    caches: dict[str, Cache]  # what its watches feed, by Watched.kind

    def watched(self, settings: Settings) -> list[Watched]:
        """What the controller lists and watches into `caches` (their changes wake the jobs they name)."""
        ...


@runtime_checkable
class Acts(Protocol):
    """An integration with writes of its own: planner.IntegrationActions it plans and applies (optional)."""

    def handles(self, action: planner.Action) -> bool:
        """Whether the action is one of its own."""
        ...

    async def apply(self, kube: k8s.Kube, ref: JobRef, action: planner.Action,
                    log: logging.LoggerAdapter[logging.Logger]) -> bool:
        """One of its own actions: whether it took effect."""
        ...


@runtime_checkable
class Follows(Protocol):
    """An integration that learns from a plan's actions as they go out (optional)."""

    def after_apply(self, memory: Any, actions: list[planner.Action]) -> None:
        """Whatever then happens: what it must read again next time."""
        ...


@runtime_checkable
class Reports(Protocol):
    """An integration with a part of the job's status of its own (optional): its key, model and columns."""

    status_part: StatusPart


@runtime_checkable
class Configurable(Protocol):
    """An integration with flags of its own (optional), called on its class before any instance exists."""

    name: str

    @staticmethod
    def add_arguments(run: argparse.ArgumentParser) -> None:
        """Its flags on `elasticjob run`."""
        ...

    @staticmethod
    def from_arguments(args: argparse.Namespace) -> Any:
        """What they set: kept in Settings under its name (Settings.integration)."""
        ...


# Every integration, in the order their placements merge (the later one's scheduler wins).
INTEGRATIONS: tuple[type, ...] = (GangIO, KueueIO)

if TYPE_CHECKING:  # mypy checks each against the protocols, with its own memory type
    from elasticjob.gang import io as gang_io
    from elasticjob.kueue import io as kueue_io

    _gang: IntegrationIO[gang_io.Memory] = GangIO()
    _kueue: IntegrationIO[kueue_io.Memory] = KueueIO()


def status_parts() -> tuple[StatusPart, ...]:
    """Each integration's own part of the job's status, for the CRD (crd.crd): Kueue's `admission`."""
    return tuple(kind.status_part for kind in INTEGRATIONS if isinstance(kind, Reports))


def build() -> tuple[IntegrationIO[Any], ...]:
    return tuple(kind() for kind in INTEGRATIONS)


def add_arguments(run: argparse.ArgumentParser) -> None:
    for kind in INTEGRATIONS:
        if isinstance(kind, Configurable):
            kind.add_arguments(run)


def configure(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with each configurable integration's own, from its flags."""
    for kind in INTEGRATIONS:
        if isinstance(kind, Configurable):
            settings = settings.with_integration(kind.name, kind.from_arguments(args))
    return settings
