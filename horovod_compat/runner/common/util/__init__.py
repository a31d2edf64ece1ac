"""Small launcher utilities (``horovod.runner.common.util``): environment, secrets, codecs,
timeouts, host lists and shell execution."""
