"""Reading what runs in a real node's cgroups while its containers come and go (the soak's invariants do it)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from localcluster.realnodes import node


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ESRCH, errno.ENODEV])
def test_a_cgroup_that_goes_while_it_is_read_holds_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              code: int) -> None:
    for name, pids in (("pod-a", "11\n12\n"), ("pod-b", "21\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text(pids)
    read = Path.read_text

    def vanishing(path: Path, *args, **kwargs) -> str:
        if path.parent.name == "pod-b":  # the kernel's answer for a cgroup removed between open and read
            raise OSError(code, "gone")
        return read(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", vanishing)
    assert sorted(node._pids_under(tmp_path)) == [11, 12]


def test_any_other_error_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cgroup.procs").write_text("1\n")
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EACCES, "denied")))
    with pytest.raises(PermissionError):
        node._pids_under(tmp_path)
