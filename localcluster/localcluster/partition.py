"""Cut a pod off the network without killing anything: the partition fault.

Peers see what a partitioned or frozen host looks like: silence. No process dies, no TCP reset is sent, the pod's
kubelet still sees it running. How each kind of node does it: processnodes.py (its veth off the bridge) and
realnodes/faults.py (DROP rules in its node's FORWARD chain). `heal` undoes it.
"""

from __future__ import annotations

from pathlib import Path

from . import faults


def partition(namespace: str, name: str, state_dir: Path = faults.DEFAULT_STATE) -> int:
    """Returns how many pod sandboxes were cut off (0: no such running pod)."""
    return faults.nodes(state_dir).partition(namespace, name)


def heal(namespace: str, name: str, state_dir: Path = faults.DEFAULT_STATE) -> int:
    return faults.nodes(state_dir).heal(namespace, name)
