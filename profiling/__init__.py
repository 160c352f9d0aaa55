"""FLOPs / latency / memory suite (imported as ``avex.profiling``). Not built yet: see the
README's status table."""
