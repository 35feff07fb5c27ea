"""Benchmarks of the course and of ddp_lib: programs that measure, not tests that pass or fail.

``python -m benchmarks.run_all`` (``make bench``) runs them and prints a table per benchmark;
docs/benchmarks.md records the figures, the machine and the command. The machines the course
runs on are often shared, so every benchmark interleaves the variants it compares (A B A B,
not A A B B), reports medians of several repetitions, and states its conclusions as ratios
measured in the same run.
"""
