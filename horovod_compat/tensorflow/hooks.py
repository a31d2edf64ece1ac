"""BroadcastGlobalVariablesHook for tf.compat.v1.train.MonitoredTrainingSession."""

from typing import Any

import tensorflow as tf

from horovod_compat.tensorflow.functions import broadcast_global_variables

_SessionRunHook = tf.compat.v1.train.SessionRunHook


class BroadcastGlobalVariablesHook(_SessionRunHook):
    """Broadcasts all global variables from ``root_rank`` once each session is created.

    Pass it to MonitoredTrainingSession(hooks=[...]) so that every rank starts from the root's
    initial (or restored) values.
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self) -> None:
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
