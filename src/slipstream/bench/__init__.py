"""Benchmark programs: `decode` (throughput per stream count, pipelined vs blocking: the decode
table, short requests, zombies, structured output) and `traffic` (what users send: mixed prompt
lengths, arrivals over time, prefill, TTFT at light load, decoding under arriving prompts)."""
