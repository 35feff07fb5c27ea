"""The notebooks' figures and widgets: ``plots`` (measured numbers), ``diagrams`` (how the data
moves), ``ring`` (the ring all-reduce's schedule and cost model) and ``timeline`` (profiler traces
as one row of compute and communication per rank)."""
