"""periods."""
