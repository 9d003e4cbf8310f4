"""What the benchmark scripts share: the servers under benchmark as subprocesses
(servers), ports, readiness, RSS and the memory account (common)."""
