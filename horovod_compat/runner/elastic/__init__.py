"""The elastic launcher (``horovodrun --min-np/--host-discovery-script``, docs/elastic.md): host
discovery, the blacklist, the worker processes and the driver that forms rounds of ranks."""
