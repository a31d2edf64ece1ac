"""TF_CONFIG -> the TCP transport's identity variables, and the precedence of launch paths."""

import json
import os
import subprocess
import sys

import pytest

from horovod_compat.common import launch_env, tf_config
from horovod_compat.common.tf_config import TfConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(cluster, kind=None, index=0):
    config = {"cluster": cluster}
    if kind is not None:
        config["task"] = {"type": kind, "index": index}
    return json.dumps(config)


def _expected_identity(hosts, rank):
    """Local/cross numbers counted directly from the host list."""
    local_rank = sum(1 for r in range(rank) if hosts[r] == hosts[rank])
    local_size = hosts.count(hosts[rank])
    first_seen = []
    for h in hosts:
        if h not in first_seen:
            first_seen.append(h)
    with_local_rank = [h for h in first_seen if hosts.count(h) > local_rank]
    return local_rank, local_size, with_local_rank.index(hosts[rank]), len(with_local_rank)


CLUSTERS = [
    {"worker": ["a:1000", "b:1000"]},
    {"chief": ["c:2000"], "worker": ["w:2001", "w:2002", "x:2003"]},
    {"worker": ["h:1", "h:2", "h:3"], "chief": ["h:4"]},
    {"chief": ["a:5"], "worker": ["a:6", "b:7", "b:8", "c:9", "a:10"],
     "evaluator": ["e:11"]},
    {"worker": ["[::1]:3000", "[::1]:3001", "10.0.0.2:3000"]},
]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_task_gets_its_rank_and_topology(cluster):
    order = cluster.get("chief", []) + cluster.get("worker", [])
    hosts = [tf_config.split_address(a)[0] for a in order]
    tasks = [("chief", i) for i in range(len(cluster.get("chief", [])))] + \
            [("worker", i) for i in range(len(cluster["worker"]))]
    for expected_rank, (kind, index) in enumerate(tasks):
        size, env = tf_config.translate(_config(cluster, kind, index))
        assert size == len(order)
        local_rank, local_size, cross_rank, cross_size = _expected_identity(hosts, expected_rank)
        assert env == {
            "HOROVOD_RANK": str(expected_rank), "HOROVOD_SIZE": str(len(order)),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(cross_rank), "HOROVOD_CROSS_SIZE": str(cross_size),
            "HOROVOD_HOSTNAME": hosts[expected_rank], "HVDC_TCP_PEERS": ",".join(order),
            "HOROVOD_CONTROLLER": "gloo", "HVDC_TCP_ADDRESS_ORIGIN": "TF_CONFIG"}


def test_topology_of_uneven_hosts():
    hosts = ["a", "a", "a", "b", "c", "c"]
    got = [tf_config.topology(hosts, r) for r in range(len(hosts))]
    for r, where in enumerate(got):
        assert (where["local_rank"], where["local_size"], where["cross_rank"],
                where["cross_size"]) == _expected_identity(hosts, r)
    # Every (cross_rank, local_rank) pair names one rank.
    assert len({(w["cross_rank"], w["local_rank"]) for w in got}) == len(hosts)


@pytest.mark.parametrize("address,expected", [
    ("host:1", ("host", 1)), ("10.1.2.3:65535", ("10.1.2.3", 65535)),
    ("[fe80::1]:22", ("fe80::1", 22)), ("a.b.c:2222", ("a.b.c", 2222))])
def test_addresses(address, expected):
    assert tf_config.split_address(address) == expected


@pytest.mark.parametrize("address", ["host", "host:", ":22", "host:0", "host:65536",
                                     "host:x", "fe80::1:22", "[fe80::1]", "[fe80::1]22"])
def test_bad_addresses(address):
    with pytest.raises(TfConfigError, match="is not a 'host:port' address"):
        tf_config.split_address(address)


def test_one_task_cluster_is_one_rank():
    for text in (_config({"worker": ["a:1"]}, "worker", 0), _config({"chief": ["a:1"]}),
                 _config({"worker": ["a:1"]})):
        size, env = tf_config.translate(text)
        assert size == 1 and env["HOROVOD_RANK"] == "0" and env["HVDC_TCP_PEERS"] == "a:1"
        variables = {"TF_CONFIG": text}
        assert launch_env.prepare(variables) == launch_env.SINGLE
        assert variables == {"TF_CONFIG": text}


@pytest.mark.parametrize("text,message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "must be a JSON object, got list"),
    ("{}", "has no 'cluster' object"),
    ('{"cluster": {"worker": "a:1,b:2"}}', r"cluster\['worker'\] must be a list"),
    ('{"cluster": {"worker": [1, 2]}}', r"cluster\['worker'\] must be a list"),
    (_config({"master": ["a:1"], "worker": ["b:1"]}, "worker"), "unknown type 'master'"),
    (_config({"worker": ["a:1"], "ps": ["p:1"]}, "worker"), "parameter-server cluster"),
    (_config({"worker": ["a:1", "b:1"], "evaluator": ["e:1"]}, "evaluator"),
     "task type 'evaluator': horovod_compat runs only 'chief' and 'worker' tasks"),
    (_config({"worker": ["a:1", "b:1"]}, "ps"),
     "task type 'ps': horovod_compat runs only 'chief' and 'worker' tasks"),
    (_config({"worker": ["a:1", "b:1"]}, "boss"), "task type 'boss' is not one of"),
    (_config({"worker": ["a:1", "b:1"]}, "worker", 2),
     r"task index 2 is out of range: the cluster has 2 'worker' task\(s\)"),
    (_config({"worker": ["a:1", "b:1"]}, "worker", -1), "task index -1 is out of range"),
    (_config({"worker": ["a:1", "b:1"]}, "chief", 0), "task index 0 is out of range"),
    (_config({"worker": ["a:1", "b:1"]}, "worker", "one"), "task index 'one' is not an integer"),
    (_config({"worker": ["a:1", "b:1"]}), "has no 'task'"),
    (_config({"chief": ["a:1", "b:1"], "worker": ["c:1"]}, "worker"), "2 'chief' tasks"),
    (_config({"worker": ["a:1", "a:1"]}, "worker"), "lists a:1 twice"),
    (_config({"worker": ["a:1", "b"]}, "worker"), "'b' is not a 'host:port' address"),
    (_config({"evaluator": ["e:1"]}, "evaluator"), "task type 'evaluator'"),
    (_config({"worker": []}), "no 'chief' or 'worker' task"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": "worker"}', "'task' must be an object"),
])
def test_malformed_tf_config(text, message):
    with pytest.raises(TfConfigError, match=message):
        tf_config.translate(text)
    with pytest.raises(ValueError, match=message):  # what hvd.init() raises
        launch_env.prepare({"TF_CONFIG": text})


def test_string_index_is_accepted():
    _, env = tf_config.translate(_config({"worker": ["a:1", "b:1"]}, "worker", "1"))
    assert env["HOROVOD_RANK"] == "1"


TWO = _config({"worker": ["a:1", "b:1"]}, "worker", 1)


@pytest.mark.parametrize("env,expected", [
    ({}, launch_env.SINGLE),
    ({"TF_CONFIG": TWO}, launch_env.TF_CONFIG),
    ({"TF_CONFIG": "  "}, launch_env.SINGLE),
    ({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "h", "TF_CONFIG": TWO}, launch_env.GLOO),
    ({"HVDC_TCP_PEERS": "a:1,b:1", "TF_CONFIG": TWO}, launch_env.GLOO),
    ({"OMPI_COMM_WORLD_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h", "TF_CONFIG": TWO},
     launch_env.MPI),
    ({"PMIX_RANK": "0", "TF_CONFIG": TWO}, launch_env.MPI),
    ({"PMI_SIZE": "2"}, launch_env.MPI),
    ({"HOROVOD_CONTROLLER": "gloo", "OMPI_COMM_WORLD_SIZE": "2",
      "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"}, launch_env.GLOO),
    ({"HOROVOD_CONTROLLER": "GLOO", "OMPI_COMM_WORLD_SIZE": "2", "TF_CONFIG": TWO},
     launch_env.TF_CONFIG),
    ({"HOROVOD_CONTROLLER": "gloo"}, launch_env.GLOO),
    ({"HOROVOD_CONTROLLER": "mpi", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h", "TF_CONFIG": TWO},
     launch_env.MPI),
])
def test_precedence(env, expected):
    assert launch_env.launch_path(env) == expected


def test_prepare_writes_the_identity_once_tf_config_is_chosen():
    env = {"TF_CONFIG": TWO, "HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_RANK": "5"}
    assert launch_env.prepare(env) == launch_env.TF_CONFIG
    _, identity = tf_config.translate(TWO)
    assert env == {"TF_CONFIG": TWO, "HOROVOD_CPU_OPERATIONS": "mpi", **identity}
    env = {"TF_CONFIG": TWO}
    launch_env.prepare(env)
    assert env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    # Under mpirun TF_CONFIG is not even parsed.
    env = {"TF_CONFIG": "{garbage", "OMPI_COMM_WORLD_SIZE": "2"}
    assert launch_env.prepare(env) == launch_env.MPI
    assert env == {"TF_CONFIG": "{garbage", "OMPI_COMM_WORLD_SIZE": "2"}
    # With HOROVOD_CONTROLLER=gloo even a one-task TF_CONFIG gives the peer list.
    env = {"TF_CONFIG": _config({"worker": ["a:1"]}, "worker"), "HOROVOD_CONTROLLER": "gloo"}
    assert launch_env.prepare(env) == launch_env.TF_CONFIG
    assert env["HVDC_TCP_PEERS"] == "a:1"


@pytest.mark.parametrize("env,expected", [
    ({}, 0), ({"OMPI_COMM_WORLD_RANK": "3"}, 3), ({"PMIX_RANK": "2"}, 2),
    ({"HOROVOD_RANK": "4"}, 4), ({"OMPI_COMM_WORLD_RANK": "3", "HOROVOD_RANK": "4"}, 3),
    ({"OMPI_COMM_WORLD_RANK": "3", "HOROVOD_RANK": "4", "HOROVOD_CONTROLLER": "gloo"}, 4)])
def test_launcher_rank(env, expected):
    assert launch_env.launcher_rank(env) == expected


@pytest.mark.timeout(120)
def test_init_reports_a_bad_tf_config():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "HVDC_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CONFIG"] = _config({"worker": ["a:1", "b:1"]}, "ps")
    code = ("from horovod_compat.common.basics import HorovodBasics\n"
            "try:\n"
            "    HorovodBasics().init()\n"
            "except ValueError as error:\n"
            "    print('ValueError:', error)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=100)
    assert "ValueError: TF_CONFIG task type 'ps'" in result.stdout, result.stdout
