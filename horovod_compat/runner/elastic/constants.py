"""The messages an elastic job ends with, worded as Horovod's (users and tests match them)."""

RESET_LIMIT_EXCEEDED_MESSAGE = ("Horovod was shutdown because number of resets during elastic job "
                                "exceeded limit: {}")

MIN_SLOTS_TIMEOUT_MESSAGE = ("Timed out waiting for {{activity}}. Please check that you have "
                             "enough resources to run at least {min_np} Horovod processes.")
MIN_SLOTS_ACTIVITY = "minimum number of slots to become available"

WORKER_FAILED_MESSAGE = ("Horovod detected that one or more processes exited with non-zero status, "
                         "thus causing the job to be terminated. The first process to do so was:\n"
                         "Process name: {name}\nExit code: {code}\n")

NO_PREVIOUS_HOSTS_MESSAGE = "No hosts from previous set remaining, unable to broadcast state."

DISCOVERY_FAILED_MESSAGE = "Failed to execute discovery script: {script}. Exit code: {code}"
