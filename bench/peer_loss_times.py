#!/usr/bin/env python3
"""Detection times of a lost peer over the TCP transport (issue 12).

Runs N jobs per case: 3 TensorFlow ranks (tests/python/peer_loss_job.py) started from TF_CONFIG by
hand, no launcher; rank 1 sends itself SIGKILL or SIGSTOP mid-training. Measures, for each survivor,
the time from the signal to the process's exit (it catches HorovodInternalError, then the runtime
ends it after HOROVOD_PEER_LOSS_EXIT_SECONDS), and prints every time, the median and the worst.

    python bench/peer_loss_times.py [--runs 10] [--cases SIGKILL,SIGSTOP] [--mode eager]

Needs the horovod_compat package of this tree built (its .so files in horovod_compat/). Each job is
bounded (--timeout); a job that does not end in time counts as a failure and is reported.
"""

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import peer_loss_launch as launch  # noqa: E402


def one_run(mode, signal_name, timeout):
    """The survivors' exit times after the signal (seconds), or an error string."""
    with tempfile.TemporaryDirectory(prefix="hvdc_peer_loss_") as out:
        result = launch.run_tf_config_job(mode, out, signal_name, timeout=timeout)
        if result["kill_time"] is None:
            return None, "rank 1 never reached its kill point"
        times = []
        for r in range(launch.SIZE):
            if r == launch.VICTIM:
                continue
            if r not in result["exits"]:
                return None, f"rank {r} did not exit within {timeout} s"
            code, ended = result["exits"][r]
            outcome = launch.caught(out, r) or {}
            if code != 1 or outcome.get("class") != "HorovodPeerLostError":
                return None, f"rank {r}: exit {code}, caught {outcome.get('class')}"
            times.append(ended - result["kill_time"])
        return times, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cases", default="SIGKILL,SIGSTOP")
    parser.add_argument("--mode", default="eager", choices=["eager", "function", "fit"])
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args()
    summary = []
    for case in args.cases.split(","):
        times, failures = [], []
        for i in range(args.runs):
            got, error = one_run(args.mode, case, args.timeout)
            if error:
                failures.append(error)
                print(f"{case} run {i + 1}: FAILED {error}", flush=True)
                continue
            times += got
            print(f"{case} run {i + 1}: survivors exited after "
                  + ", ".join(f"{t:.2f}" for t in got) + " s", flush=True)
        if times:
            summary.append(f"{case}: {len(times)} survivor exits over {args.runs} kills: median "
                           f"{statistics.median(times):.2f} s, worst {max(times):.2f} s"
                           + (f", {len(failures)} failed runs" if failures else ""))
        else:
            summary.append(f"{case}: no successful run ({len(failures)} failures)")
    print("\n".join(["", "kill -> survivor exit (np=3, TCP from TF_CONFIG, defaults "
                     "HOROVOD_PEER_TIMEOUT_SECONDS / HOROVOD_PEER_LOSS_EXIT_SECONDS):"] + summary))
    return 0 if all("failed" not in s and "no successful" not in s for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
