"""The real processes that the tests (tests/infra.py) and the benchmarks (scripts/bench_lib, the
probes, scripts/loadtest, scripts/rehearse-hosts) both start and stop: neither's own, used by both.

- processes: where the CLIs are, a child's environment, stopping a process and waiting for it to
  go, the chromafs mounts under a directory and unmounting them, ingesting and mounting with the
  real CLIs, and the log files of the chromafs daemons started (which the tests check).
- servers: `chroma run`, `redis-server`, moto's S3 server, chromafs-csi and chromafs-mountd, each on
  a free loopback port or a socket of its own, waited for until it answers and stopped by its PID.
"""
