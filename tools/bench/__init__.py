"""``turnlog bench``: throughput, turn-to-durable latency, write cost and memory against same-run baselines."""
