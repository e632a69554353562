"""Test support shipped with the package: the float64 NumPy reference."""
