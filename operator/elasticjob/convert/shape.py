"""The type of every field the converter reads, checked before it reads any, so that a field of the wrong type
(`replicas: "two"`, a list where a mapping belongs) is refused with its path and not met as a traceback midway.

The types are Kubeflow's PyTorchJob API's (kubeflow.org/v1) and, in the pod template, Kubernetes' own; the fields
the converter only copies are left to the API server. A null counts as absent, as it does for the API server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from elasticjob import torchrun
from elasticjob.convert.errors import InputError

EACH_KEY, EACH_ITEM = "*", "[]"  # path steps: every value of a mapping, every item of a list


@dataclass(frozen=True)
class Expect:
    words: str  # what the message says was expected
    holds: Callable[[Any], bool]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAPPING = Expect("a mapping", lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v))
LIST = Expect("a list", lambda v: isinstance(v, list))
STRING = Expect("a string", lambda v: isinstance(v, str))
WHOLE = Expect("a whole number", _whole)
BOOLEAN = Expect("true or false", lambda v: isinstance(v, bool))
WHOLE_OR_STRING = Expect("a whole number or a string", lambda v: _whole(v) or isinstance(v, str))
GPU_COUNT = Expect("a whole number of GPUs", lambda v: _whole(v) or isinstance(v, str) and v.isascii() and v.isdigit())

OBJECT = [(("apiVersion",), STRING), (("kind",), STRING), (("metadata",), MAPPING), (("metadata", "name"), STRING)]
# A List (kubectl's, or the API's own PyTorchJobList): its items are objects, each checked as one.
LIST_OBJECT = [(("apiVersion",), STRING), (("kind",), STRING), (("items",), LIST), (("items", EACH_ITEM), MAPPING)]

_METADATA = [(("metadata", key), expect) for key, expect in [
    ("namespace", STRING), ("generateName", STRING), ("labels", MAPPING), ("annotations", MAPPING)]]
_CONTAINER: list[tuple[tuple[str, ...], Expect]] = [
    ((), MAPPING), (("name",), STRING), (("command",), LIST), (("command", EACH_ITEM), STRING),
    (("args",), LIST), (("args", EACH_ITEM), STRING), (("env",), LIST), (("env", EACH_ITEM), MAPPING),
    (("env", EACH_ITEM, "name"), STRING), (("resources",), MAPPING),
    *[(("resources", section), MAPPING) for section in ("limits", "requests")],
    *[(("resources", section, gpu), GPU_COUNT) for section in ("limits", "requests")
      for gpu in torchrun.GPU_RESOURCES],
]
# A pod affinity term or a topology spread constraint: the pod label selector and the keys that convert rewrites.
_SELECTOR_TERM: list[tuple[tuple[str, ...], Expect]] = [
    ((), MAPPING), (("labelSelector",), MAPPING), (("labelSelector", "matchLabels"), MAPPING),
    (("labelSelector", "matchLabels", EACH_KEY), STRING), (("labelSelector", "matchExpressions"), LIST),
    *[(("labelSelector", "matchExpressions", EACH_ITEM, *path), expect) for path, expect in [
        ((), MAPPING), (("key",), STRING), (("operator",), STRING), (("values",), LIST),
        (("values", EACH_ITEM), STRING)]],
    *[(path, expect) for keys in ("matchLabelKeys", "mismatchLabelKeys")
      for path, expect in [((keys,), LIST), ((keys, EACH_ITEM), STRING)]],
]
_PLACEMENT: list[tuple[tuple[str, ...], Expect]] = [
    (("affinity",), MAPPING),
    *[(path, expect) for kind in ("podAffinity", "podAntiAffinity") for path, expect in [
        (("affinity", kind), MAPPING), (("affinity", kind, "requiredDuringSchedulingIgnoredDuringExecution"), LIST),
        *[(("affinity", kind, "requiredDuringSchedulingIgnoredDuringExecution", EACH_ITEM, *p), e)
          for p, e in _SELECTOR_TERM],
        (("affinity", kind, "preferredDuringSchedulingIgnoredDuringExecution"), LIST),
        (("affinity", kind, "preferredDuringSchedulingIgnoredDuringExecution", EACH_ITEM), MAPPING),
        *[(("affinity", kind, "preferredDuringSchedulingIgnoredDuringExecution", EACH_ITEM, "podAffinityTerm", *p), e)
          for p, e in _SELECTOR_TERM]]],
    (("topologySpreadConstraints",), LIST),
    *[(("topologySpreadConstraints", EACH_ITEM, *path), expect) for path, expect in _SELECTOR_TERM],
]
_REPLICA = ("spec", "pytorchReplicaSpecs", EACH_KEY)
_TEMPLATE = (*_REPLICA, "template")
_REPLICAS = [
    (("spec", "pytorchReplicaSpecs"), MAPPING), (_REPLICA, MAPPING), ((*_REPLICA, "replicas"), WHOLE),
    ((*_REPLICA, "restartPolicy"), STRING), (_TEMPLATE, MAPPING), ((*_TEMPLATE, "spec"), MAPPING),
    ((*_TEMPLATE, "spec", "containers"), LIST),
    *[((*_TEMPLATE, "spec", "containers", EACH_ITEM, *path), expect) for path, expect in _CONTAINER],
    *[((*_TEMPLATE, "spec", *path), expect) for path, expect in _PLACEMENT],
]
_ELASTIC = [(("spec", "elasticPolicy", *path), expect) for path, expect in [
    ((), MAPPING), (("minReplicas",), WHOLE), (("maxReplicas",), WHOLE), (("maxRestarts",), WHOLE),
    (("nProcPerNode",), WHOLE_OR_STRING), (("rdzvBackend",), STRING), (("rdzvHost",), STRING),
    (("rdzvId",), STRING), (("rdzvPort",), WHOLE), (("standalone",), BOOLEAN), (("rdzvConf",), LIST),
    (("rdzvConf", EACH_ITEM), MAPPING), (("rdzvConf", EACH_ITEM, "key"), STRING),
    (("rdzvConf", EACH_ITEM, "value"), WHOLE_OR_STRING), (("metrics",), LIST)]]
_RUN_POLICY = [(("spec", "runPolicy", *path), expect) for path, expect in [
    ((), MAPPING), (("backoffLimit",), WHOLE), (("suspend",), BOOLEAN), (("activeDeadlineSeconds",), WHOLE),
    (("ttlSecondsAfterFinished",), WHOLE), (("cleanPodPolicy",), STRING), (("managedBy",), STRING),
    (("schedulingPolicy",), MAPPING), (("schedulingPolicy", "queue"), STRING),
    (("schedulingPolicy", "priorityClass"), STRING), (("schedulingPolicy", "minAvailable"), WHOLE),
    (("schedulingPolicy", "scheduleTimeoutSeconds"), WHOLE), (("schedulingPolicy", "minResources"), MAPPING)]]
# Parents before their fields: a parent of the wrong type is the one reported.
# Where the pytorch-operator's kubeflow.org/v1 kept what the training operator's keeps in runPolicy.
_SPEC_RUN_POLICY = [(("spec", key), expect) for key, expect in [
    ("cleanPodPolicy", STRING), ("backoffLimit", WHOLE), ("activeDeadlineSeconds", WHOLE),
    ("ttlSecondsAfterFinished", WHOLE)]]
PYTORCHJOB = [*_METADATA, (("spec",), MAPPING), *_REPLICAS, (("spec", "nprocPerNode"), WHOLE_OR_STRING),
              *_ELASTIC, *_RUN_POLICY, *_SPEC_RUN_POLICY]


def check(document: dict[str, Any], fields: list[tuple[tuple[str, ...], Expect]]) -> None:
    """Raises InputError naming the first field, by its path, whose value is not of the type expected."""
    for path, expect in fields:
        for where, value in _values(document, path, ""):
            if not expect.holds(value):
                raise InputError(f"{where}: expected {expect.words}, found {_describe(value)}")


def _values(node: Any, path: tuple[str, ...], where: str) -> Iterator[tuple[str, Any]]:
    """The values at `path` under `node`, each with its own path written out. Under a parent of another type
    there are none (the parent's own check says so); a null in a mapping is absent, a null in a list is not."""
    if not path:
        yield where, node
        return
    step, rest = path[0], path[1:]
    if step == EACH_ITEM and isinstance(node, list):
        for index, item in enumerate(node):
            yield from _values(item, rest, f"{where}[{index}]")
    elif step == EACH_KEY and isinstance(node, dict):
        for key, value in node.items():
            if value is not None:
                yield from _values(value, rest, f"{where}.{key}" if where else str(key))
    elif isinstance(node, dict) and node.get(step) is not None:
        yield from _values(node[step], rest, f"{where}.{step}" if where else step)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        odd = next((key for key in value if not isinstance(key, str)), None)
        return "a mapping" if odd is None else f"a mapping with the key {odd!r}, not a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return str(value).lower()
    words = repr(value)[:60] + ("..." if len(repr(value)) > 60 else "")
    if isinstance(value, str):
        return f"the string {words}"
    return f"the number {words}" if isinstance(value, int | float) else f"{type(value).__name__} {words}"
