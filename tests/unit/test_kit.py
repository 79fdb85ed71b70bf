"""Which worker commands the operator routes through the kit's launcher, and what the job's pods get (kit.py)."""

from __future__ import annotations

import pytest
from tests.unit.factory import NOW, UID, job, observed, rdzv, spec, template, worker

from elasticjob import builders, domain, kit, planner
from elasticjob.domain import JobRef

IMAGE = "elasticjob-operator:1.0"
L = kit.LAUNCH


@pytest.mark.parametrize(("command", "args", "routed"), [
    (["torchrun"], ["--nproc-per-node=2", "train.py"], [L, "torchrun", "--nproc-per-node=2", "train.py"]),
    (["/usr/local/bin/torchrun", "train.py"], None, [L, "/usr/local/bin/torchrun", "train.py"]),
    (["python", "-m", "torch.distributed.run", "t.py"], None, [L, "python", "-m", "torch.distributed.run", "t.py"]),
    (["python3.11"], ["-m", "torch.distributed.run", "t.py"], [L, "python3.11", "-m", "torch.distributed.run", "t.py"]),
    (["python", "-m", "elasticjob_warm.torchrun", "t.py"], None,
     [L, "python", "-m", "elasticjob_warm.torchrun", "t.py"]),
    (["bash", "-c"], ["pip list && torchrun train.py"],
     ["bash", "-c", f'PATH="{kit.PATH_DIR}:$PATH"; export PATH; pip list && torchrun train.py']),
    (["/bin/sh", "-ec", "exec torchrun t.py", "arg0"], None,
     ["/bin/sh", "-ec", f'PATH="{kit.PATH_DIR}:$PATH"; export PATH; exec torchrun t.py', "arg0"]),
    (["python", "train.py"], None, None),  # not torchrun: a single process
    (["python", "-m", "torch.distributed.launch", "t.py"], None, None),  # deprecated launcher: as written
    (["bash", "-c", "python train.py"], None, None),  # a shell without torchrun
    (["bash", "script.sh"], None, None),  # a script file: what it runs is unknown
    (["mytorchrun", "t.py"], None, None),
])
def test_commands_that_run_torchrun_go_through_the_launcher(command, args, routed):
    container = {"command": command, **({"args": args} if args else {})}
    warm = kit.warm_starts(spec(), container, IMAGE)
    assert warm.command == routed
    assert warm.reason == ("KitLauncher" if routed else "CommandNotTorchrun")


@pytest.mark.parametrize(("fields", "container", "image", "reason"), [
    ({"warmStarts": False}, {"command": ["torchrun", "t.py"]}, IMAGE, "Disabled"),
    ({}, {"command": ["torchrun", "t.py"]}, None, "NoKit"),
    ({}, {"args": ["torchrun", "t.py"]}, IMAGE, "NoCommand"),  # args alone: the image's entrypoint runs
])
def test_what_keeps_a_job_cold_is_named(fields, container, image, reason):
    warm = kit.warm_starts(spec(**fields), container, image)
    assert (warm.on, warm.reason) == (False, reason)


def ref(**fields) -> JobRef:
    return JobRef(namespace="ml", name="train", uid=UID, spec=spec(**fields))


def test_a_warm_worker_gets_the_kit_first_and_keeps_its_own_init_containers_and_volumes():
    t = template(args=["--x"], volumeMounts=[{"name": "data", "mountPath": "/data"}])
    t["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    t["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod = builders.worker_pod(ref(template=t), 0, "10.96.0.1:29400", kit_image=IMAGE)
    spec_ = pod["spec"]
    assert [c["name"] for c in spec_["initContainers"]] == [kit.INIT_CONTAINER, "fetch"]
    init = spec_["initContainers"][0]
    assert init["image"] == IMAGE and init["command"] == ["python", "-m", "elasticjob_kit", kit.DIR]
    assert init["securityContext"]["runAsNonRoot"] and init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [v["name"] for v in spec_["volumes"]] == ["data", kit.VOLUME]
    (worker_,) = spec_["containers"]
    assert worker_["command"] == [L, "torchrun", "train.py", "--x"] and "args" not in worker_
    assert {"name": kit.VOLUME, "mountPath": kit.DIR, "readOnly": True} in worker_["volumeMounts"]
    assert {"name": "data", "mountPath": "/data"} in worker_["volumeMounts"]


@pytest.mark.parametrize(("fields", "image"), [({"warmStarts": False}, IMAGE), ({}, None)])
def test_a_cold_worker_runs_its_command_as_written_without_the_kit(fields, image):
    pod = builders.worker_pod(ref(**fields), 0, "10.96.0.1:29400", kit_image=image)
    assert pod["spec"]["containers"][0]["command"] == ["torchrun", "train.py"]
    assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]
    assert "readinessProbe" not in pod["spec"]["containers"][0], "no agent of the kit answers it"


def test_a_warm_worker_is_ready_while_its_agent_hears_from_the_store_unless_its_template_says_otherwise():
    pod = builders.worker_pod(ref(), 0, "10.96.0.1:29400", kit_image=IMAGE)
    (worker_,) = pod["spec"]["containers"]
    assert worker_["readinessProbe"] == {"httpGet": {"path": "/healthz", "port": kit.HEALTH_PORT},
                                         "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2,
                                         "successThreshold": 1}
    assert {"name": "ELASTICJOB_HEALTH_PORT", "value": str(kit.HEALTH_PORT)} in worker_["env"]
    own = {"exec": {"command": ["true"]}}
    pod = builders.worker_pod(ref(template=template(readinessProbe=own)), 0, "10.96.0.1:29400", kit_image=IMAGE)
    (worker_,) = pod["spec"]["containers"]
    assert worker_["readinessProbe"] == own
    assert "ELASTICJOB_HEALTH_PORT" not in [e["name"] for e in worker_["env"]]
    # spec.kit Image: the image's own kit may predate the endpoint; a probe nothing answers would keep it unready.
    pod = builders.worker_pod(ref(kit="Image"), 0, "10.96.0.1:29400", kit_image=IMAGE)
    assert "readinessProbe" not in pod["spec"]["containers"][0]


def test_the_store_runs_from_the_kit_whatever_the_job_says_about_warm_starts():
    pod = builders.rendezvous_pod(ref(warmStarts=False), kit_image=IMAGE)
    (store,) = pod["spec"]["containers"]
    assert store["command"] == [L, "store"]
    assert pod["spec"]["initContainers"][0]["name"] == kit.INIT_CONTAINER
    bare = builders.rendezvous_pod(ref(), kit_image=None)
    assert bare["spec"]["containers"][0]["command"] == ["python", "-m", "elasticjob_store"]
    assert "initContainers" not in bare["spec"]


def warm_condition(result):
    return next(c for c in result.status.conditions if c.type == "WarmStarts")


def test_the_job_says_whether_its_workers_start_warm_and_warns_once_when_its_command_keeps_them_cold():
    settings = domain.Settings(kit_image=IMAGE)
    warm = planner.plan(job(), observed([rdzv(), worker(0), worker(1)]), NOW, settings)
    assert (warm_condition(warm).status, warm_condition(warm).reason) == ("True", "KitLauncher")
    assert not [e for e in warm.events if e.reason == "WarmStartsOff"]
    cold = job(template=template(command=["python", "train.py"]))
    first = planner.plan(cold, observed([rdzv(), worker(0), worker(1)]), NOW, settings)
    assert (warm_condition(first).status, warm_condition(first).reason) == ("False", "CommandNotTorchrun")
    assert [e.reason for e in first.events if e.reason == "WarmStartsOff"] == ["WarmStartsOff"]
    status = first.status.model_dump(by_alias=True, exclude_none=True)
    again = planner.plan(job(status, template=template(command=["python", "train.py"])),
                         observed([rdzv(), worker(0), worker(1)]), NOW, settings)
    assert not [e for e in again.events if e.reason == "WarmStartsOff"]
    no_kit = planner.plan(job(), observed([rdzv(), worker(0), worker(1)]), NOW, domain.Settings())
    assert warm_condition(no_kit).reason == "NoKit" and not no_kit.events


def test_kueues_workload_counts_the_kits_init_container_where_the_pods_get_it():
    from elasticjob.kueue import workloads as kueue

    warm_sets = kueue.pod_sets(ref(), IMAGE)
    workers, store = (s["template"]["spec"] for s in warm_sets)
    assert [c["name"] for c in workers["initContainers"]] == [kit.INIT_CONTAINER]
    assert [c["name"] for c in store["initContainers"]] == [kit.INIT_CONTAINER]
    cold_workers, cold_store = (s["template"]["spec"] for s in kueue.pod_sets(ref(warmStarts=False), IMAGE))
    assert "initContainers" not in cold_workers and cold_store["initContainers"]
    assert all("initContainers" not in s["template"]["spec"] for s in kueue.pod_sets(ref(), None))


@pytest.mark.parametrize(("argv", "env", "reason"), [
    (["torchrun", "--nnodes=1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint=h:29400", "t.py"], None, "KitLauncher"),
    (["torchrun", "-m", "pkg.train", "--no-python"], None, "KitLauncher"),  # the module's own argument
    (["torchrun", "t.py", "--run-path"], None, "KitLauncher"),  # the script's own argument
    (["torchrun", "-r", "3", "-t3", "--module", "pkg.train"], None, "KitLauncher"),
    (["torchrun", "--no-python", "python3", "-c", "print(1)"], None, "TorchrunRunsCold"),
    (["torchrun", "--nproc-per-node", "2", "--no_python", "./run.sh"], None, "TorchrunRunsCold"),
    (["/opt/bin/torchrun", "--run-path", "/app/t.py"], None, "TorchrunRunsCold"),
    (["python3", "-m", "torch.distributed.run", "--standalone", "--run_path", "/app/t.py"], None, "TorchrunRunsCold"),
    (["torchrun", "./run.sh"], [{"name": "PET_NO_PYTHON", "value": "1"}], "TorchrunRunsCold"),
    (["torchrun", "t.py"], [{"name": "PET_NO_PYTHON", "value": "0"}], "KitLauncher"),
    (["bash", "-c", "torchrun --no-python ./run.sh"], None, "KitLauncher"),  # its agent finds out and says so
])
def test_torchrun_options_that_keep_workers_cold_are_named_from_the_spec(argv, env, reason):
    container = {"command": argv, **({"env": env} if env else {})}
    warm = kit.warm_starts(spec(), container, IMAGE)
    assert warm.reason == reason and warm.on == (reason == "KitLauncher")
    if reason == "TorchrunRunsCold":
        assert "runs as written" in warm.message and reason in kit.COMMAND_REASONS
