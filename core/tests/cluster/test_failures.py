"""A worker that dies produces a report naming role, rank, phase and its last log lines, and the driver
never hangs: a worker exiting inside a method, one killed by a signal, one dying while its engine is
built, and a data-parallel rank dying while its peer waits for it in a gloo all-reduce."""

import os
import pickle
import signal
import sys
import threading
import time

import pytest
import ray.cloudpickle
from rlcore.api import EngineSpec
from rlcore.cluster import RayGroup, WorkerError, WorkerFailure, start_ray, stop_ray
from rlcore.cluster.failures import death_reason, read_tail
from rlcore.cluster.workers import Worker
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.fakes import FakeTrainConfig

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CrashWorker(Worker):
    """Prints, then dies in the ways workers die."""

    def __init__(self, rank: int, die_in_init: bool = False):
        self._start("crasher", rank)
        if die_in_init:
            print(f"rank {rank} is building its engine", flush=True)
            os._exit(7)

    def topology(self):
        return self.rank, 2, True

    def crash(self, marker: str, code: int):
        if self.rank == 1:
            print(f"stdout before the crash: {marker}")
            print(f"stderr before the crash: {marker}", file=sys.stderr)
            os._exit(code)
        time.sleep(60)  # rank 0 is busy (as in a collective) until the group stops it

    def sleep(self, seconds: float):
        time.sleep(seconds)
        return self.rank


@pytest.fixture(scope="module")
def ray_session():
    stop_ray()
    yield start_ray(num_cpus=2)
    stop_ray()


def crash_group(die_in_init=False):
    return RayGroup(
        "crasher", CrashWorker, lambda rank, dist: {"rank": rank, "die_in_init": die_in_init}, 2, poll_s=0.2
    )


@pytest.mark.timeout(180)
def test_a_worker_exiting_inside_a_method_is_reported_with_its_log(ray_session):
    group = crash_group()
    pid = group.ping()[1]["pid"]
    with pytest.raises(WorkerFailure) as info:
        group.call_all("crash", "marker-4711", 3)
    failure = info.value
    assert (failure.role, failure.rank, failure.phase) == ("crasher", 1, "crash")
    text = str(failure)
    assert text.startswith(f"crasher rank 1 died during crash (pid {pid}")
    assert "stdout before the crash: marker-4711" in text and "stderr before the crash: marker-4711" in text
    assert ":job_id:" not in failure.log_tail  # Ray's marker lines are not log lines
    # The group stopped its other rank (which was busy for another minute) and stays failed.
    with pytest.raises(WorkerFailure, match="crasher rank 1 died during crash"):
        group.call_all("sleep", 0)
    group.shutdown()


@pytest.mark.timeout(180)
def test_a_worker_killed_by_a_signal_is_reported(ray_session):
    group = crash_group()
    pid = group.ping()[0]["pid"]
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(WorkerFailure) as info:
        group.call_all("sleep", 60)
    assert (info.value.rank, info.value.phase) == (0, "sleep")
    assert f"crasher rank 0 died during sleep (pid {pid}" in str(info.value)
    group.shutdown()


@pytest.mark.timeout(180)
def test_a_worker_dying_while_built_is_reported_with_its_log(ray_session):
    with pytest.raises(WorkerFailure) as info:
        crash_group(die_in_init=True)
    assert info.value.phase == "__init__" and info.value.role == "crasher"
    assert f"rank {info.value.rank} is building its engine" in str(info.value)


@pytest.mark.timeout(300)
def test_a_dead_rank_is_reported_while_its_peer_waits_in_an_all_reduce(ray_session):
    # Both ranks pay 4 s, then all-reduce their gradients over gloo; rank 0 dies during those 4 s, so
    # rank 1 ends up waiting for it in the all-reduce. The driver must name rank 0, not hang.
    config = FakeTrainConfig(step_cost_s=4.0)
    group = RayGroup.train("actor", "fake", EngineSpec(model_path=""), config, world_size=2, poll_s=0.2)
    pid = group.ping()[0]["pid"]
    batch = contract_batch(4, vocab_low=1, vocab_high=200)
    threading.Timer(1.5, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(WorkerFailure) as info:
        group.dispatch("train_step", batch, token_nll_loss)
    assert (info.value.role, info.value.rank, info.value.phase) == ("actor", 0, "train_step")
    group.shutdown()


def test_read_tail_keeps_the_last_lines_without_ray_markers(tmp_path):
    log = tmp_path / "worker.err"
    log.write_text(":job_id:01000000\n:actor_name:_RayHost\n" + "".join(f"line {i}\n" for i in range(100)))
    assert read_tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert read_tail(log, 3, max_bytes=20) == ["line 98", "line 99"]  # a partial first line is cut off
    assert read_tail(log, 1000)[0] == "line 0"


def test_death_reason_keeps_rays_account_without_its_advice():
    class Died(Exception):
        error_msg = (
            "The actor died unexpectedly before finishing this task.\n\tclass_name: X\n\tpid: 12\n"
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker "
            "exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common "
            "causes include: (1) the process was killed by the OOM killer"
        )

    assert death_reason(Died()) == (
        "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
        "error code 2. End of file."
    )


def test_reports_pickle_with_their_fields():
    error = pickle.loads(
        pickle.dumps(WorkerError("actor", 1, "infer", "ValueError: x", "Traceback ...", "engine 'e'"))
    )
    assert (error.role, error.rank, error.phase, error.detail) == ("actor", 1, "infer", "ValueError: x")
    assert error.source == "engine 'e'"
    assert str(error).startswith(
        "actor rank 1 (engine 'e') failed in infer: ValueError: x\n--- traceback in the"
    )
    where = {"pid": 5, "hostname": "h", "node_ip": "10.0.0.1"}
    failure = pickle.loads(pickle.dumps(WorkerFailure("critic", 0, "train_step", "killed", where, "boom")))
    assert str(failure) == (
        "critic rank 0 died during train_step (pid 5, hostname h, node_ip 10.0.0.1): killed\n"
        "--- last lines of the worker's log ---\nboom"
    )
