"""social."""
