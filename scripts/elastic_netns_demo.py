"""Issue 27's done-criterion run: a 4-worker elastic Fashion-MNIST job on the netns cluster loses
a host mid-epoch, goes on with the others, takes the host back when discovery lists it again, and
ends at the accuracy of the same job run without interruption.

    ../shared/tools/netns-cluster up 3          (as root; hosts hvhost1..3)
    .venv/bin/python scripts/elastic_netns_demo.py [--epochs 2] [--cluster PATH] [--out DIR]

Both jobs are ``horovodrun -np 4 --min-np 2 --max-np 4 --host-discovery-script`` over hosts
hvhost1:1, hvhost2:1, hvhost3:2 running examples/keras_elastic.py unchanged. In the interrupted
one, --cut-after seconds after the first round formed, hvhost3 is lost: cut off the network
(link down) and dropped from the discovery script's list at once, or (--loss kill) its processes
SIGKILLed and its link cut, and dropped from discovery a few seconds later (a preempted
machine); --back-after seconds later its link comes back and discovery lists it again. The script prints both accuracies, the
times the workers logged, and exits 1 if the interrupted job failed, never lost or regained the
host, or ends more than --tolerance below the uninterrupted one.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS_ALL = ["hvhost1:1", "hvhost2:1", "hvhost3:2"]
HOSTS_LOST = ["hvhost1:1", "hvhost2:1"]


def default_cluster():
    return os.path.join(os.path.dirname(ROOT), "shared", "tools", "netns-cluster")


def write_hosts(path, hosts):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(hosts) + "\n")
    os.replace(tmp, path)  # the launcher never reads half a list


def run_job(args, out_dir, name, events):
    """Runs one job; `events(t_start, lines, stamp)` is called from a watcher thread and may
    change the cluster. Returns (exit code, output lines, accuracy or None)."""
    hosts_file = os.path.join(out_dir, f"{name}_hosts.txt")
    write_hosts(hosts_file, HOSTS_ALL)
    discover = os.path.join(out_dir, f"{name}_discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts_file}\n")
    os.chmod(discover, 0o755)
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("HOROVOD_", "HVDC_", "OMPI_", "PMIX_")):
            del env[key]
    env.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]))
    if args.debug:
        env["HOROVOD_LOG_LEVEL"] = "debug"
    cmd = [sys.executable, "-c", "from horovod_compat.runner.launch import main; main()",
           "-np", "4", "--min-np", "2", "--max-np", "4",
           "--host-discovery-script", discover,
           "--blacklist-cooldown-range", "5", "10", "--elastic-timeout", "60",
           "--remote-shell", f"{args.cluster} rsh",
           sys.executable, os.path.join(ROOT, "examples", "keras_elastic.py"),
           "--epochs", str(args.epochs)]
    lines = []
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, cwd=out_dir, start_new_session=True)
    log = open(os.path.join(out_dir, f"{name}.log"), "w")

    def stamp(what):
        lines.append(f"@{time.time() - t0:7.1f}s {what}")
        if not log.closed:
            log.write(lines[-1] + "\n")
        print(f"[{name}] {lines[-1]}", flush=True)

    watcher = threading.Thread(target=events, args=(t0, lines, stamp, hosts_file), daemon=True)
    watcher.start()
    try:
        for raw in iter(proc.stdout.readline, ""):
            for part in raw.replace("\r", "\n").splitlines():
                if part.strip():
                    lines.append(f"@{time.time() - t0:7.1f}s {part}")
                    log.write(lines[-1] + "\n")
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stamp("timed out: terminating the job")
        proc.terminate()
        proc.wait(timeout=60)
    log.close()
    accuracy = None
    for line in lines:
        m = re.search(r"Test accuracy: ([0-9.]+)", line)
        if m:
            accuracy = float(m.group(1))
    stamp(f"exit {proc.returncode}, accuracy {accuracy}, {time.time() - t0:.0f} s")
    return proc.returncode, lines, accuracy


def training_started(lines):
    """The first round formed (Keras prints no header for the first epoch of a fit of one)."""
    return any("round 1:" in line for line in lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--cluster", default=default_cluster())
    p.add_argument("--out", default="/tmp/elastic_netns_demo")
    p.add_argument("--cut-after", type=float, default=15.0,
                   help="seconds after the first round before hvhost3 is lost")
    p.add_argument("--back-after", type=float, default=20.0,
                   help="seconds after the loss before hvhost3 is back")
    p.add_argument("--loss", choices=["cut", "kill"], default="cut",
                   help="cut: hvhost3's link goes down and discovery drops it at once (its "
                        "workers live on, cut off); kill: its processes are SIGKILLed and its "
                        "link goes down, and discovery drops it --discovery-lag s later")
    p.add_argument("--discovery-lag", type=float, default=5.0)
    p.add_argument("--tolerance", type=float, default=0.015,
                   help="accuracy the interrupted job may lose (fraction)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--debug", action="store_true", help="workers log at debug level")
    p.add_argument("--skip-baseline", action="store_true")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    def no_events(t0, lines, stamp, hosts_file):
        pass

    happened = {}

    def lose_and_regain(t0, lines, stamp, hosts_file):
        while not training_started(lines):
            if time.time() - t0 > args.timeout:
                return
            time.sleep(0.2)
        stamp("first round formed")
        time.sleep(args.cut_after)
        if args.loss == "kill":  # the machine dies: its processes with it
            pids = subprocess.run(["ip", "netns", "pids", "hvhost3"], stdout=subprocess.PIPE,
                                  text=True, timeout=30).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
        subprocess.run([args.cluster, "cut", "3"], check=True, timeout=30)
        happened["cut"] = time.time() - t0
        if args.loss == "kill":
            stamp(f"hvhost3 lost: {len(pids)} processes killed (SIGKILL), link cut")
            time.sleep(args.discovery_lag)
        write_hosts(hosts_file, HOSTS_LOST)
        stamp("hvhost3 dropped from discovery" if args.loss == "kill"
              else "hvhost3 cut off and dropped from discovery")
        time.sleep(args.back_after)
        subprocess.run([args.cluster, "heal", "3"], check=True, timeout=30)
        write_hosts(hosts_file, HOSTS_ALL)
        happened["back"] = time.time() - t0
        stamp("hvhost3 healed and listed again")

    base_acc = None
    if not args.skip_baseline:
        code, _, base_acc = run_job(args, args.out, "uninterrupted", no_events)
        if code != 0 or base_acc is None:
            print("the uninterrupted job failed", file=sys.stderr)
            return 1
    try:
        code, lines, acc = run_job(args, args.out, "interrupted", lose_and_regain)
    finally:
        subprocess.run([args.cluster, "heal", "3"], timeout=30)
    events = [line for line in lines
              if re.search(r"horovodrun:|hvhost3|Epoch [0-9]+/|Test accuracy", line)]
    print("\n".join(events[-40:]))
    print(f"uninterrupted accuracy: {base_acc}; interrupted: {acc}; events: {happened}")
    ok = code == 0 and acc is not None and "back" in happened
    if ok and base_acc is not None:
        ok = acc >= base_acc - args.tolerance
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
