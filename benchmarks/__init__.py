"""Benchmarks of accel_nb side by side with the reference library; run with python -m benchmarks run."""
