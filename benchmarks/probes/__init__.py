"""Single-question probes: each answers one question about one cost (a claim's CPU per call, a
row's decoding, a round trip, a plan) and is run by hand, `python -m benchmarks.probes.<name>`,
writing `benchmarks/results/<name>/`. The suite (`python -m benchmarks`, its scenarios and the
harness they share: env, procs, burn, dbcost, alternating, report) is the package above.
"""
