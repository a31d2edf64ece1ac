"""bench/b8_overhead.py's bookkeeping (no benchmark is run): reading threads from a /proc-like
folder, the timed window around the example's iterations, grouping threads, and the table."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("b8_overhead",
                                               os.path.join(ROOT, "bench", "b8_overhead.py"))
b8 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(b8)


def _stat(tid, comm, utime, stime):
    # Fields 3.. after "(comm)": state, then 10 more before utime (14) and stime (15).
    return f"{tid} ({comm}) S " + " ".join(["0"] * 10) + f" {utime} {stime} 0 0 20 0 1\n"


@pytest.mark.timeout(60)
def test_read_threads_takes_utime_plus_stime_and_odd_comms(tmp_path):
    for tid, comm, u, s in [(10, "python", 7, 3), (11, "hvdc-control", 5, 0),
                            (12, "a) b (c", 1, 2)]:
        d = tmp_path / str(tid)
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(_stat(tid, comm, u, s))
    (tmp_path / "13").mkdir()  # ended between listing and reading: skipped
    assert b8.read_threads(str(tmp_path)) == {10: ("python", 10), 11: ("hvdc-control", 5),
                                              12: ("a) b (c", 3)}


@pytest.mark.timeout(60)
def test_sampler_times_every_call_but_the_warmup():
    calls = []

    def fake_timeit(stmt, number=1):
        calls.append(number)
        return 0.5 * number

    sampler = b8.Sampler(fake_timeit)
    assert sampler(None, number=3) == 1.5      # warm-up: not sampled
    assert sampler.start is None and sampler.iters == []
    sampler(None, number=2)
    sampler(None, number=2)
    assert calls == [3, 2, 2]
    assert sampler.iters == [(2, 1.0), (2, 1.0)]
    assert os.getpid() in sampler.start and os.getpid() in sampler.end
    assert sampler.t1 >= sampler.t0


def _proc(pid, window, start, end, stages, iters=((5, 2.0), (5, 4.0))):
    # As it comes back from JSON: string tids, lists for tuples.
    return {"pid": pid, "clk_tck": 100, "iters": [list(i) for i in iters], "window_s": window,
            "stages": stages, "start": {str(t): list(v) for t, v in start.items()},
            "end": {str(t): list(v) for t, v in end.items()}}


@pytest.mark.timeout(60)
def test_threads_are_grouped_by_name_and_by_when_they_started():
    stages = {"start": [100], "before_init": [100, 101], "after_init": [100, 101, 102, 103, 104]}
    start = {100: ("python", 1000), 101: ("python", 10), 102: ("hvdc-control", 0),
             103: ("hvdc-exec-0", 50), 104: ("python", 0), 105: ("tf_Compute", 0),
             106: ("python", 0)}
    # 10 s window at 100 ticks/s: 1000 ticks = 100 % of a core.
    end = {100: ("python", 1100), 101: ("python", 10), 102: ("hvdc-control", 40),
           103: ("hvdc-exec-0", 150), 104: ("python", 20), 105: ("tf_Compute", 300),
           106: ("python", 500), 107: ("tf_graph_runner", 5), 108: ("python", 100)}
    fig = b8.process_figures(_proc(100, 10.0, start, end, stages), batch=16)
    # img/sec: the mean over iterations of batch * steps / seconds = mean(40, 20).
    assert fig["img_sec"] == pytest.approx(30.0)
    expected = {"main": 10.0, "other": 0.0, "control": 4.0, "executor": 10.0, "mpi/io": 2.0,
                # tf_Compute, then 106 and 108 (unnamed, started after init; 108 during the
                # window, counted from zero)
                "compute": 30.0 + 50.0 + 10.0, "tf-other": 0.5}
    assert fig["cpu_pct"] == pytest.approx(expected)
    assert fig["cpu_pct_total"] == pytest.approx(sum(expected.values()))
    assert fig["threads"][0] == {"tid": 106, "comm": "python", "group": "compute", "pct": 50.0}

    # Without the runtime there is no init: threads from the start are "other", later ones
    # TensorFlow's.
    no_rt = b8.process_figures(_proc(100, 10.0, {100: ("python", 0), 101: ("python", 0)},
                                     {100: ("python", 100), 101: ("python", 100),
                                      106: ("python", 700)}, {"start": [100, 101]}), batch=16)
    assert no_rt["cpu_pct"]["main"] == pytest.approx(10.0)
    assert no_rt["cpu_pct"]["other"] == pytest.approx(10.0)
    assert no_rt["cpu_pct"]["compute"] == pytest.approx(70.0)
    assert no_rt["cpu_pct"]["mpi/io"] == 0.0


def _run(path, round_, totals, compute=(80.0, 60.0), ok=True):
    procs = [{"img_sec": t, "cpu_pct": dict.fromkeys(b8.GROUPS, 0.0, ) | {"compute": c},
              "cpu_pct_total": c} for t, c in zip(totals, compute)]
    return {"path": path, "round": round_, "ok": ok, "procs": procs,
            "total_img_sec": sum(totals)}


@pytest.mark.timeout(60)
def test_summary_divides_by_the_reference_of_the_same_round():
    runs = [_run("mpirun", 0, (20.0, 20.0)), _run("none", 0, (25.0, 25.0)),
            _run("mpirun", 1, (22.0, 22.0)), _run("none", 1, (20.0, 20.0)),
            _run("mpirun", 2, (30.0, 30.0), ok=False), _run("none", 2, (30.0, 30.0)),
            _run("mpirun", 3, (18.0, 18.0), compute=(90.0, 90.0)),
            _run("none", 3, (24.0, 24.0))]
    s = b8.summarize(runs, ["mpirun", "none"])
    assert s["mpirun"]["img_sec"] == [40.0, 44.0, 36.0]
    assert s["mpirun"]["ratio"] == pytest.approx([40 / 50, 44 / 40, 36 / 48])
    assert s["mpirun"]["ratio_median"] == pytest.approx(0.8)
    assert s["mpirun"]["rounds_failed"] == 1
    assert s["mpirun"]["cpu_pct"]["compute"] == pytest.approx(70.0)   # median of 70, 70, 90
    assert s["none"]["ratio"] == [1.0] * 4
    table = b8.markdown(s, ["mpirun", "none"]).splitlines()
    assert table[0].startswith("| launch | img/sec total, median (range) | ours / no runtime |")
    assert table[2].startswith("| `mpirun -np 2` (1 failed) | 40.0 (36.0–44.0) | 0.80 "
                               "(0.75–1.10) | 70 |")
    assert table[3].startswith("| no runtime, one core each (reference) | 49.0 (40.0–60.0) | – |")


@pytest.mark.timeout(60)
def test_every_path_starts_two_processes():
    for path in b8.PATHS:
        procs = b8.commands(path, "py", ["b8.py", "rank"])
        launched = 2 if path in ("tf-config", "none", "none-unpinned") else 1
        assert len(procs) == launched, path
        if path == "tf-config":
            envs = [e["TF_CONFIG"] for _, e in procs]
            assert '"index": 0' in envs[0] and '"index": 1' in envs[1]
        if path.startswith("none"):
            assert all(cmd[-1] == "--no-horovod" for cmd, _ in procs)
        else:
            assert all("--no-horovod" not in cmd for cmd, _ in procs)
